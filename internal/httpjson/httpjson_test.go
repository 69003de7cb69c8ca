package httpjson

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Post sends the value as JSON with its Content-Type, and tells a 2xx
// answer from a refusal.
func TestPost(t *testing.T) {
	var got struct {
		method, contentType string
		body                map[string]any
	}
	code := http.StatusNoContent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.contentType = r.Method, r.Header.Get("Content-Type")
		got.body = nil
		json.NewDecoder(r.Body).Decode(&got.body)
		w.WriteHeader(code)
	}))
	defer srv.Close()
	if err := Post(context.Background(), srv.Client(), srv.URL+"/hook", map[string]any{"orderNo": "A1", "n": 2}); err != nil {
		t.Fatal(err)
	}
	if got.method != http.MethodPost || got.contentType != "application/json" || got.body["orderNo"] != "A1" || got.body["n"] != 2.0 {
		t.Fatalf("the endpoint got %+v", got)
	}
	code = http.StatusServiceUnavailable
	err := Post(context.Background(), srv.Client(), srv.URL+"/hook", map[string]any{})
	var refused *StatusError
	if !errors.As(err, &refused) || refused.Code != 503 || refused.Status != "503 Service Unavailable" {
		t.Fatalf("a 503: %v", err)
	}
}

// An endpoint that does not answer, or too late, fails without the URL in
// the error: its path or user may hold a token.
func TestPostErrorsHideTheURL(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(500 * time.Millisecond)
	}))
	defer slow.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for name, c := range map[string]struct {
		client *http.Client
		url    string
	}{
		"refused":  {http.DefaultClient, strings.Replace(closed.URL, "http://", "http://user:s3cret@", 1) + "/hooks/s3cret-token"},
		"timeout":  {&http.Client{Timeout: 50 * time.Millisecond}, slow.URL + "/hooks/s3cret-token"},
		"bad url":  {http.DefaultClient, "http://exa mple.com/hooks/s3cret-token"},
		"no proto": {http.DefaultClient, "ftp://example.com/hooks/s3cret-token"},
	} {
		t.Run(name, func(t *testing.T) {
			err := Post(context.Background(), c.client, c.url, map[string]any{})
			if err == nil {
				t.Fatal("no error")
			}
			if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "hooks") {
				t.Fatalf("the error shows the URL: %v", err)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	in := `failed to send to http://u:p@collector:4318/tenant/tok/v1/traces: 400 Bad Request; Post "https://c.example/x/y": EOF`
	got := Redact(in)
	if strings.Contains(got, "tok") || strings.Contains(got, "u:p") || strings.Contains(got, "/x/y") || !strings.Contains(got, "collector:4318") {
		t.Errorf("Redact: %s", got)
	}
}
