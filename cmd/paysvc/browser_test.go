package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
)

// browser starts a headless Chromium for the test, closed when it ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	// Chromium may still write to its profile as the test ends: not t.TempDir,
	// whose cleanup fails on a busy directory.
	profile, err := os.MkdirTemp("", "paysvc-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(profile),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() {
		cancelTimeout()
		cancel()
		chromedp.Cancel(ctx)
		cancelAlloc()
		os.RemoveAll(profile)
	})
	return ctx
}

// chromium finds Debian's headless browser (scripts/ensure-test-tools.sh
// installs it). Its absence fails the test: it is not optional.
func chromium(t *testing.T) string {
	for _, p := range []string{os.Getenv("PAYSVC_TEST_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p != "" {
			if _, err := exec.LookPath(p); err == nil {
				return p
			}
		}
	}
	t.Fatal("no chromium: run scripts/ensure-test-tools.sh (apt-get install chromium)")
	return ""
}

// The dead-letter page in a real browser: log in with the token, filter the
// list, open a message, replay it with a reason, and the order ends PAID.
func TestAdminPageReplayInBrowser(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (51, 2.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('WEB1', 51, 7.50)")
	addr, _ := w.daemonInProcess("PAYSVC_RETRY_MAXATTEMPTS=0")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("WEB1", 51, "7.50"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'WEB1' AND status = 'NEW'") == 1
	}, "no dead letter to replay")
	w.db.MustExec("UPDATE t_account SET balance = 20.00 WHERE user_id = 51")

	ctx := browser(t)
	base := "http://" + addr
	var listText, prediction, msg, status string
	var shot []byte
	err := chromedp.Run(ctx,
		chromedp.Navigate(base+"/dlq"),
		chromedp.WaitVisible("#token", chromedp.ByID), // redirected to the sign-in page
		chromedp.SendKeys("#token", bobToken, chromedp.ByID),
		chromedp.Click("#login", chromedp.ByID),
		chromedp.WaitVisible("#filters", chromedp.ByID),
		chromedp.SetValue(`input[name="class"]`, "balance_not_enough", chromedp.ByQuery),
		chromedp.Submit("#filters", chromedp.ByID),
		chromedp.WaitVisible(`tr[data-order="WEB1"]`, chromedp.ByQuery),
		chromedp.Text("#dead-letters", &listText, chromedp.ByID),
		chromedp.Click(`tr[data-order="WEB1"] a`, chromedp.ByQuery),
		chromedp.WaitVisible("#replay", chromedp.ByID),
		chromedp.Text("#prediction", &prediction, chromedp.ByID),
		chromedp.SendKeys("#replay-reason", "balance topped up by support", chromedp.ByID),
		chromedp.Click("#replay", chromedp.ByID),
		chromedp.WaitVisible("#msg", chromedp.ByID),
		chromedp.Text("#msg", &msg, chromedp.ByID),
		chromedp.Text("#status", &status, chromedp.ByID),
		chromedp.FullScreenshot(&shot, 100),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	os.WriteFile(filepath.Join(os.TempDir(), "paysvc-admin-replay.png"), shot, 0o644) // for a look by hand
	if !strings.Contains(listText, "WEB1") || !strings.Contains(listText, "balance_not_enough") {
		t.Fatalf("list page: %q", listText)
	}
	if !strings.Contains(prediction, "would deduct 7.50 from user 51") {
		t.Fatalf("prediction %q", prediction)
	}
	if !strings.Contains(msg, "replayed to q.pay.success") || status != "REPLAYED" {
		t.Fatalf("after the click: msg %q, status %q", msg, status)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'WEB1' AND status = 'PAID'") == 1
	}, "the replayed order did not end PAID")
	if w.count(`SELECT COUNT(*) FROM t_dead_letter_event WHERE event = 'REPLAYED' AND operator = 'bob'
		AND reason = 'balance topped up by support'`) != 1 {
		t.Fatal("no audit row for the browser replay")
	}
	if w.count("SELECT COUNT(*) FROM t_account_flow WHERE biz_no = 'WEB1'") != 1 ||
		w.count("SELECT COUNT(*) FROM t_account WHERE user_id = 51 AND balance = 12.50") != 1 {
		t.Fatal("the replay did not take 7.50 exactly once")
	}

	// Discard, in the same browser: a malformed message is parked, the
	// operator discards it with a reason, and the audit trail says who.
	testenv.Publish(t, w.amqpURL, listener.MainQueue, []byte(`{"orderNo":"WEB2","userId":51}`))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'WEB2' AND status = 'NEW'") == 1
	}, "the malformed message was not parked")
	var discardMsg, discardStatus, who string
	err = chromedp.Run(ctx,
		// Bob signs out; Carol signs in (her token is configured as a hash).
		chromedp.Click("#logout", chromedp.ByID),
		chromedp.WaitVisible("#token", chromedp.ByID),
		chromedp.SendKeys("#token", carolToken, chromedp.ByID),
		chromedp.Click("#login", chromedp.ByID),
		chromedp.WaitVisible("#filters", chromedp.ByID),
		chromedp.Text("#who", &who, chromedp.ByID),
		chromedp.Navigate(base+"/dlq?order=WEB2"),
		chromedp.WaitVisible(`tr[data-order="WEB2"]`, chromedp.ByQuery),
		chromedp.Click(`tr[data-order="WEB2"] a`, chromedp.ByQuery),
		chromedp.WaitVisible("#discard", chromedp.ByID),
		chromedp.SendKeys("#discard-reason", "malformed by the producer", chromedp.ByID),
		chromedp.Click("#discard", chromedp.ByID),
		chromedp.WaitVisible("#msg", chromedp.ByID),
		chromedp.Text("#msg", &discardMsg, chromedp.ByID),
		chromedp.Text("#status", &discardStatus, chromedp.ByID),
	)
	if err != nil {
		t.Fatalf("browser discard: %v", err)
	}
	if !strings.Contains(who, "carol") {
		t.Fatalf("after Carol signed in the page says %q", who)
	}
	if discardMsg != "discarded" || discardStatus != "DISCARDED" {
		t.Fatalf("after the discard click: msg %q, status %q", discardMsg, discardStatus)
	}
	if w.count(`SELECT COUNT(*) FROM t_dead_letter_event e JOIN t_dead_letter d ON d.id = e.dead_letter_id
		WHERE d.order_no = 'WEB2' AND e.event = 'DISCARDED' AND e.operator = 'carol' AND e.reason = 'malformed by the producer'`) != 1 {
		t.Fatal("no audit row for the browser discard")
	}
}

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

// Bulk actions in the browser: the list counts NEW dead letters by class
// and charts them by day; two selected rows are discarded after a dry run
// that changes nothing, then a whole class is replayed the same way; the
// audit trail names the signed-in operator on every row.
func TestAdminBulkActionsInBrowser(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (61, 1.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('BK1', 61, 5.00), ('BK2', 61, 6.00)")
	addr, _ := w.daemonInProcess("PAYSVC_RETRY_MAXATTEMPTS=0")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("BK1", 61, "5.00"), payment("BK2", 61, "6.00"),
		[]byte(`{"orderNo":"BAD1"}`), []byte(`{"orderNo":"BAD2"}`), []byte(`{"orderNo":"BAD3"}`))
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_dead_letter WHERE status = 'NEW'") == 5
	}, "the five messages were not parked")
	w.db.MustExec("UPDATE t_account SET balance = 100.00 WHERE user_id = 61")
	ids := map[string]string{}
	for _, no := range []string{"BAD1", "BAD2", "BAD3"} {
		var id string
		w.db.Get(&id, "SELECT id FROM t_dead_letter WHERE order_no = ?", no)
		ids[no] = id
	}

	ctx := browser(t)
	base := "http://" + addr
	var counts, chartBars, dry, dryAfterConfirm, results string
	err := chromedp.Run(ctx,
		chromedp.Navigate(base+"/dlq?status=NEW"),
		chromedp.WaitVisible("#token", chromedp.ByID),
		chromedp.SendKeys("#token", carolToken, chromedp.ByID),
		chromedp.Click("#login", chromedp.ByID),
		chromedp.WaitVisible("#counts", chromedp.ByID),
		chromedp.Text("#counts", &counts, chromedp.ByID),
		chromedp.Evaluate(`Array.from(document.querySelectorAll("#chart rect")).map(r => r.dataset.n).join(",")`, &chartBars),
		// Two rows selected, discard: the dry run first.
		chromedp.Click(`input[name="id"][value="`+ids["BAD1"]+`"]`, chromedp.ByQuery),
		chromedp.Click(`input[name="id"][value="`+ids["BAD2"]+`"]`, chromedp.ByQuery),
		chromedp.Click("#discard-selected", chromedp.ByID),
		chromedp.WaitVisible("#confirm", chromedp.ByID),
		chromedp.Text("#bulk-lines", &dry, chromedp.ByID),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if !strings.Contains(counts, "bad_message: 3") || !strings.Contains(counts, "balance_not_enough: 2") {
		t.Fatalf("counts by class: %q", counts)
	}
	bars := strings.Split(chartBars, ",")
	if len(bars) != 14 || bars[len(bars)-1] != "5" {
		t.Fatalf("chart bars %q: want 14 days, today's 5", chartBars)
	}
	if !strings.Contains(dry, "BAD1") || !strings.Contains(dry, "BAD2") || strings.Contains(dry, "BAD3") || !strings.Contains(dry, "would be discarded") {
		t.Fatalf("dry run: %q", dry)
	}
	if n := w.count("SELECT COUNT(*) FROM t_dead_letter WHERE status = 'NEW'"); n != 5 {
		t.Fatalf("the dry run changed something: %d NEW", n)
	}
	err = chromedp.Run(ctx,
		chromedp.SendKeys("#bulk-reason", "producer bug, reissued", chromedp.ByID),
		chromedp.Click("#confirm", chromedp.ByID),
		chromedp.WaitNotPresent("#confirm", chromedp.ByID),
		chromedp.Text("#bulk-lines", &dryAfterConfirm, chromedp.ByID),
		// The whole class balance_not_enough, replayed.
		chromedp.Navigate(base+"/dlq?status=NEW"),
		chromedp.WaitVisible(`button.replay-class[data-class="balance_not_enough"]`, chromedp.ByQuery),
		chromedp.Click(`button.replay-class[data-class="balance_not_enough"]`, chromedp.ByQuery),
		chromedp.WaitVisible("#confirm", chromedp.ByID),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	// A payment of the same class parked between the dry run and the
	// confirmation is not swept in: the confirmation names the rows shown.
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (62, 1.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('BK3', 62, 5.00)")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("BK3", 62, "5.00"))
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'BK3' AND status = 'NEW'") == 1
	}, "BK3 was not parked")
	err = chromedp.Run(ctx,
		chromedp.SendKeys("#bulk-reason", "accounts topped up", chromedp.ByID),
		chromedp.Click("#confirm", chromedp.ByID),
		chromedp.WaitNotPresent("#confirm", chromedp.ByID),
		chromedp.Text("#bulk-lines", &results, chromedp.ByID),
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	if strings.Count(dryAfterConfirm, "discarded") != 2 {
		t.Fatalf("discard results: %q", dryAfterConfirm)
	}
	if strings.Count(results, "replayed") != 2 {
		t.Fatalf("replay results: %q", results)
	}
	if w.count(`SELECT COUNT(*) FROM t_dead_letter_event WHERE event = 'DISCARDED' AND operator = 'carol'
		AND reason = 'producer bug, reissued'`) != 2 || w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'BAD3' AND status = 'NEW'") != 1 {
		t.Fatal("the discard did not touch exactly the two selected rows, as carol")
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no IN ('BK1', 'BK2') AND status = 'PAID'") == 2
	}, "the replayed class was not paid")
	if w.count(`SELECT COUNT(*) FROM t_dead_letter_event WHERE event = 'REPLAYED' AND operator = 'carol'`) != 2 {
		t.Fatal("the class replay is not recorded under carol")
	}
	if w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'BK3' AND status = 'NEW'") != 1 {
		t.Fatal("a row parked after the dry run was replayed with the class")
	}
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
