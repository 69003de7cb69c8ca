package admin_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/testenv"
)

// A session is bound to the token it was opened with: once an operator's
// token is changed in admin.operators (a leaked token rotated, every
// replica restarted), the sessions opened with the old token stop working,
// without anyone revoking them by hand.
func TestRotatingATokenEndsItsSessions(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	const oldToken, newToken = "alice-old-token-0123456789", "alice-new-token-9876543210"
	serve := func(spec string) *httptest.Server {
		ops, err := admin.ParseOperators(spec)
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		(&admin.Server{Operators: ops, Sessions: &admin.Sessions{DB: db, TTL: time.Hour}, Log: zap.NewNop()}).Register(mux)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		return srv
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	signIn := func(srv *httptest.Server, token string) *http.Cookie {
		t.Helper()
		resp, err := client.PostForm(srv.URL+"/login", url.Values{"token": {token}, "next": {"/dlq"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for _, c := range resp.Cookies() {
			if c.Name == "paysvc_admin" && c.Value != "" {
				return c
			}
		}
		t.Fatalf("sign-in: %d, no session cookie", resp.StatusCode)
		return nil
	}
	status := func(srv *httptest.Server, c *http.Cookie) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/admin/sessions", nil)
		req.AddCookie(c)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Location")
	}

	before := serve("alice:" + oldToken)
	leaked := signIn(before, oldToken)
	if code, _ := status(before, leaked); code != http.StatusOK {
		t.Fatalf("a fresh session: %d, want 200", code)
	}
	after := serve("alice:" + newToken) // the token rotated
	if code, loc := status(after, leaked); code != http.StatusSeeOther || !strings.HasPrefix(loc, "/login") {
		t.Fatalf("the session opened with the old token: %d %q, want a redirect to /login", code, loc)
	}
	if code, _ := status(after, signIn(after, newToken)); code != http.StatusOK {
		t.Fatalf("a session opened with the new token: %d, want 200", code)
	}
}

// A sign-in sends the browser back only to a page of the admin under /dlq,
// as the browser will read the Location: never to another host, however
// the next parameter is spelled.
func TestSignInRedirectsOnlyUnderDLQ(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ops, err := admin.ParseOperators("alice:alice-token-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	(&admin.Server{Operators: ops, Sessions: &admin.Sessions{DB: db, TTL: time.Hour}, Log: zap.NewNop()}).Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for next, want := range map[string]string{
		"/dlq/42":                "/dlq/42",
		"/dlq?class=timeout":     "/dlq?class=timeout",
		"/dlq/../\\evil.example": "/dlq",
		"/dlq/../../evil":        "/dlq",
		"/dlq/%2e%2e/x":          "/dlq",
		"/dlqx":                  "/dlq",
		"//evil.example/dlq":     "/dlq",
		"https://evil.example":   "/dlq",
		"/dlq\\@evil.example":    "/dlq",
	} {
		resp, err := client.PostForm(srv.URL+"/login", url.Values{"token": {"alice-token-0123456789"}, "next": {next}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		target, err := url.Parse(srv.URL + "/login")
		if err != nil {
			t.Fatal(err)
		}
		if resolved, err := target.Parse(strings.ReplaceAll(loc, "\\", "/")); err != nil || resolved.Host != target.Host || loc != want {
			t.Errorf("next=%q: Location %q, want %q on this host", next, loc, want)
		}
	}
}
