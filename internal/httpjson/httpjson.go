// Package httpjson talks to endpoints whose URL is a secret: a webhook
// with a token in its path, an OTLP collector with credentials in its user
// or path. Post sends JSON and never puts the URL in its errors; Redact
// hides the user and path of any URL in an error text from elsewhere (an
// exporter's).
package httpjson

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"regexp"
)

// StatusError is an answer outside 2xx: the endpoint was reached and
// refused.
type StatusError struct {
	Code   int
	Status string // the status line, "503 Service Unavailable"
}

func (e *StatusError) Error() string { return "answered " + e.Status }

// Post sends v as JSON (Content-Type: application/json) to endpoint with
// client, whose Timeout bounds the exchange, and closes the response body
// unread. It returns nil on a 2xx answer, a *StatusError on another, and
// otherwise why the endpoint did not answer: never with the URL, which
// may hold a secret token.
func Post(ctx context.Context, client *http.Client, endpoint string, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return withoutURL(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return withoutURL(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return &StatusError{Code: resp.StatusCode, Status: resp.Status}
	}
	return nil
}

// withoutURL is err without the URL a *url.Error names.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

var (
	urlUser = regexp.MustCompile(`(https?://)[^/@\s"]+@`)
	urlPath = regexp.MustCompile(`(https?://[^/\s"]+)/[^\s"]*`)
)

// Redact hides the user and the path of every URL in s: an endpoint may
// hold a token in either. The scheme, host and port stay, to say which
// endpoint failed.
func Redact(s string) string {
	s = urlUser.ReplaceAllString(s, "${1}xxxxx@")
	return urlPath.ReplaceAllString(s, "${1}/xxxxx")
}
