package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
)

// Without the token every page refuses, and a forged cross-site form post is
// turned away even with a valid session.
func TestAdminPagesNeedTheToken(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr, _ := w.daemonInProcess()
	client := noRedirect()
	for _, path := range []string{"/dlq", "/dlq/1"} {
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 303 || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			t.Fatalf("GET %s without a token: %d %s", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	resp, err := client.Post("http://"+addr+"/dlq/1/discard", "application/x-www-form-urlencoded", strings.NewReader("reason=x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("POST without a token: %d", resp.StatusCode)
	}
	req, _ := newRequest("POST", "http://"+addr+"/dlq/1/discard", "reason=x")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Origin", "http://evil.example")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("cross-origin POST: %d", resp.StatusCode)
	}
	req, _ = newRequest("GET", "http://"+addr+"/dlq", "")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /dlq with the token: %d", resp.StatusCode)
	}
}

func noRedirect() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func newRequest(method, url, form string) (*http.Request, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(form))
	if err == nil && form != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return req, err
}

// Sessions end: on sign-out, when another operator revokes them (the
// revocation names who), and when they expire. A wrong token signs nobody
// in.
func TestAdminSessionsEndAndAreRevoked(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	addr, _ := w.daemonInProcess()
	base := "http://" + addr
	signIn := func(token string) *http.Cookie {
		t.Helper()
		resp, err := noRedirect().PostForm(base+"/login", map[string][]string{"token": {token}, "next": {"/dlq"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for _, c := range resp.Cookies() {
			if c.Name == "paysvc_admin" && c.Value != "" {
				return c
			}
		}
		t.Fatalf("sign-in with %q: %d, no session cookie", token[:3], resp.StatusCode)
		return nil
	}
	status := func(c *http.Cookie) int {
		req, _ := http.NewRequest("GET", base+"/dlq", nil)
		req.AddCookie(c)
		resp, err := noRedirect().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	bob := signIn(bobToken)
	if status(bob) != 200 {
		t.Fatal("bob's session does not open the list")
	}
	// Carol revokes Bob's session from the sessions page.
	var id string
	if err := w.db.Get(&id, "SELECT id FROM t_admin_session WHERE operator = 'bob' AND revoked_at IS NULL"); err != nil {
		t.Fatal(err)
	}
	req, _ := newRequest("POST", base+"/admin/sessions/"+id+"/revoke", "")
	req.Header.Set("Authorization", "Bearer "+carolToken)
	resp, err := noRedirect().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if status(bob) != 303 || w.count("SELECT COUNT(*) FROM t_admin_session WHERE id = ? AND revoked_by = 'carol'", id) != 1 {
		t.Fatal("bob's revoked session still works, or the revocation does not say who")
	}
	// An expired session is refused.
	bob = signIn(bobToken)
	w.db.MustExec("UPDATE t_admin_session SET expires_at = CURRENT_TIMESTAMP(3) - INTERVAL 1 SECOND WHERE operator = 'bob' AND revoked_at IS NULL")
	if status(bob) != 303 {
		t.Fatal("an expired session still opens the list")
	}
	// Sign-out ends the session on the server, not just in the browser.
	carol := signIn(carolToken)
	req, _ = newRequest("POST", base+"/logout", "")
	req.AddCookie(carol)
	if resp, err = noRedirect().Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if status(carol) != 303 {
		t.Fatal("a signed-out session still opens the list")
	}
	// A wrong token signs nobody in.
	resp, err = noRedirect().PostForm(base+"/login", map[string][]string{"token": {"bob"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !strings.Contains(resp.Header.Get("Location"), "error") {
		t.Fatalf("sign-in with a wrong token: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// An operator's replay or discard acts on the row as their page showed it:
// Bob discards a dead letter while Alice has its page open; her replay,
// single or bulk, is refused and nothing is charged. So is a form that
// does not say what its page showed.
func TestAdminActsOnlyOnTheRowItsPageShowed(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (62, 1.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('SE1', 62, 5.00), ('SE2', 62, 6.00), ('SE3', 62, 7.00)")
	addr, _ := w.daemonInProcess("PAYSVC_RETRY_MAXATTEMPTS=0")
	base := "http://" + addr
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("SE1", 62, "5.00"), payment("SE2", 62, "6.00"), payment("SE3", 62, "7.00"))
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_dead_letter WHERE status = 'NEW'") == 3
	}, "the three payments were not parked")
	w.db.MustExec("UPDATE t_account SET balance = 100.00 WHERE user_id = 62")
	id := func(order string) string {
		var id string
		if err := w.db.Get(&id, "SELECT id FROM t_dead_letter WHERE order_no = ?", order); err != nil {
			t.Fatal(err)
		}
		return id
	}
	seenRe := regexp.MustCompile(`name="seen" value="([^"]+)"`)
	// do sends a form as token's operator and returns the response's
	// status, redirect and body.
	do := func(token, method, path, form string) (int, string, string) {
		t.Helper()
		req, _ := newRequest(method, base+path, form)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := noRedirect().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location"), string(body)
	}
	seenOn := func(body string) []string {
		var out []string
		for _, m := range seenRe.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}

	// The page: Alice reads it, Bob discards the row, Alice replays.
	one := id("SE1")
	_, _, page := do(adminToken, "GET", "/dlq/"+one, "")
	aliceSaw := seenOn(page)
	_, _, page = do(bobToken, "GET", "/dlq/"+one, "")
	if len(aliceSaw) != 2 || aliceSaw[0] != "NEW:1" {
		t.Fatalf("the page's forms carry %v, want NEW:1 in both", aliceSaw)
	}
	if _, loc, _ := do(bobToken, "POST", "/dlq/"+one+"/discard", "reason=cancelled&seen="+seenOn(page)[1]); !strings.Contains(loc, "discarded") {
		t.Fatalf("bob's discard: %s", loc)
	}
	_, loc, _ := do(adminToken, "POST", "/dlq/"+one+"/replay", "reason=topped+up&seen="+url.QueryEscape(aliceSaw[0]))
	if !strings.Contains(loc, url.QueryEscape("changed since it was read")) {
		t.Fatalf("a replay of a row discarded since the page was read: %s", loc)
	}
	// Without what the page showed, nothing is done either.
	two := id("SE2")
	if _, loc, _ := do(adminToken, "POST", "/dlq/"+two+"/replay", "reason=topped+up"); !strings.Contains(loc, "reload") {
		t.Fatalf("a replay without seen: %s", loc)
	}

	// The bulk path: Alice's dry run, Bob's discard, Alice's confirmation.
	_, _, dry := do(adminToken, "POST", "/dlq/bulk", "action=replay&id="+two)
	shown := seenOn(dry)
	if len(shown) != 1 || shown[0] != two+":NEW:1" {
		t.Fatalf("the dry run's confirmation carries %v", shown)
	}
	_, _, page = do(bobToken, "GET", "/dlq/"+two, "")
	do(bobToken, "POST", "/dlq/"+two+"/discard", "reason=cancelled&seen="+seenOn(page)[1])
	_, _, result := do(adminToken, "POST", "/dlq/bulk", "action=replay&confirm=1&reason=topped+up&id="+two+"&seen="+url.QueryEscape(shown[0]))
	if !strings.Contains(result, "changed since it was read") {
		t.Fatalf("a bulk replay of a row discarded since the dry run: %s", result)
	}
	if code, _, _ := do(adminToken, "POST", "/dlq/bulk", "action=replay&confirm=1&reason=topped+up&id="+two); code != http.StatusBadRequest {
		t.Fatalf("a bulk confirmation without seen: %d, want 400", code)
	}

	// Ticked on the list while NEW, discarded by Bob before Alice's dry
	// run: the dry run leaves it out and its confirmation cannot name it.
	three := id("SE3")
	_, _, list := do(adminToken, "GET", "/dlq", "")
	if !strings.Contains(list, `name="id" value="`+three+`"`) {
		t.Fatalf("the list offers no checkbox for NEW row %s", three)
	}
	_, _, page = do(bobToken, "GET", "/dlq/"+three, "")
	do(bobToken, "POST", "/dlq/"+three+"/discard", "reason=cancelled&seen="+seenOn(page)[1])
	_, _, dry = do(adminToken, "POST", "/dlq/bulk", "action=replay&id="+three)
	if seenOn(dry) != nil || strings.Contains(dry, `name="id" value="`+three+`"`) || !strings.Contains(dry, "is DISCARDED now: left out") {
		t.Fatalf("a dry run of a row discarded since the list was shown offers to replay it: %s", dry)
	}

	if n := w.count("SELECT COUNT(*) FROM t_dead_letter WHERE status = 'DISCARDED'"); n != 3 {
		t.Fatalf("%d rows DISCARDED, want all three kept", n)
	}
	if n := w.count("SELECT COUNT(*) FROM t_dead_letter_event WHERE event = 'REPLAYED'"); n != 0 {
		t.Fatalf("%d replays recorded", n)
	}
	if n := w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'"); n != 0 {
		t.Fatalf("%d discarded payments charged", n)
	}
}

// The daemon's session cookie is Secure by default, over plain HTTP too
// (a TLS-terminating ingress in front), and admin.secureCookie false
// leaves it off: a cookie a browser may send over plain HTTP elsewhere.
func TestAdminCookieSecureByDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env    []string
		secure bool
	}{{nil, true}, {[]string{"PAYSVC_ADMIN_SECURECOOKIE=false"}, false}} {
		t.Run(fmt.Sprintf("secure=%v", c.secure), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t)
			addr, _ := w.daemonInProcess(c.env...)
			resp, err := noRedirect().PostForm("http://"+addr+"/login", url.Values{"token": {bobToken}, "next": {"/dlq"}})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			var got *http.Cookie
			for _, ck := range resp.Cookies() {
				if ck.Name == "paysvc_admin" && ck.Value != "" {
					got = ck
				}
			}
			if got == nil || got.Secure != c.secure || !got.HttpOnly {
				t.Fatalf("%v: session cookie %v, want HttpOnly, Secure %v", c.env, got, c.secure)
			}
		})
	}
}
