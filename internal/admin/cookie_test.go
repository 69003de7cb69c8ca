package admin_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/testenv"
)

// The session cookie is Secure by default, over plain HTTP too (behind a
// TLS-terminating ingress the request paysvc sees is plain HTTP), on sign-in
// and on sign-out; InsecureCookie (admin.secureCookie false) leaves it off.
func TestSessionCookieIsSecureUnlessOptedOut(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	const token = "alice-token-0123456789"
	ops, err := admin.ParseOperators("alice:" + token)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// cookies signs in and out of a server over plain HTTP and returns
	// the session cookie each set.
	cookies := func(insecure bool) (in, out *http.Cookie) {
		mux := http.NewServeMux()
		(&admin.Server{Operators: ops, Sessions: &admin.Sessions{DB: db, TTL: time.Hour}, Log: zap.NewNop(),
			InsecureCookie: insecure}).Register(mux)
		srv := httptest.NewServer(mux)
		defer srv.Close()
		find := func(resp *http.Response) *http.Cookie {
			for _, c := range resp.Cookies() {
				if c.Name == "paysvc_admin" {
					return c
				}
			}
			t.Fatalf("%s %s: %d, no session cookie", resp.Request.Method, resp.Request.URL.Path, resp.StatusCode)
			return nil
		}
		resp, err := client.PostForm(srv.URL+"/login", url.Values{"token": {token}, "next": {"/dlq"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		in = find(resp)
		req, _ := http.NewRequest("POST", srv.URL+"/logout", nil)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.AddCookie(in)
		if resp, err = client.Do(req); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return in, find(resp)
	}

	in, out := cookies(false)
	if !in.Secure || !in.HttpOnly || in.SameSite != http.SameSiteStrictMode || in.Value == "" {
		t.Errorf("sign-in cookie by default: %s, want Secure, HttpOnly, SameSite=Strict", in)
	}
	if !out.Secure || out.MaxAge >= 0 {
		t.Errorf("sign-out cookie by default: %s, want Secure and deleted", out)
	}
	in, out = cookies(true)
	if in.Secure || !in.HttpOnly || in.Value == "" {
		t.Errorf("sign-in cookie with InsecureCookie: %s, want HttpOnly without Secure", in)
	}
	if out.Secure || out.MaxAge >= 0 {
		t.Errorf("sign-out cookie with InsecureCookie: %s, want deleted without Secure", out)
	}
}
