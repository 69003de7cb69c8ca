package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
)

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

	// Chromium may still write to its profile as the test ends: not t.TempDir,
	// whose cleanup fails on a busy directory.
	profile, err := os.MkdirTemp("", "paysvc-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(profile)
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
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer func() { cancel(); chromedp.Cancel(ctx) }()
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	defer cancelTimeout()

	base := "http://" + addr
	var listText, prediction, msg, status string
	var shot []byte
	err = chromedp.Run(ctx,
		chromedp.Navigate(base+"/dlq"),
		chromedp.WaitVisible("#token", chromedp.ByID), // redirected to the login page
		chromedp.SendKeys("#token", adminToken, chromedp.ByID),
		chromedp.Click("#login", chromedp.ByID),
		chromedp.WaitVisible("#filters", chromedp.ByID),
		chromedp.SetValue(`input[name="class"]`, "balance_not_enough", chromedp.ByQuery),
		chromedp.Submit("#filters", chromedp.ByID),
		chromedp.WaitVisible(`tr[data-order="WEB1"]`, chromedp.ByQuery),
		chromedp.Text("#dead-letters", &listText, chromedp.ByID),
		chromedp.Click(`tr[data-order="WEB1"] a`, chromedp.ByQuery),
		chromedp.WaitVisible("#replay", chromedp.ByID),
		chromedp.Text("#prediction", &prediction, chromedp.ByID),
		chromedp.SendKeys(`form[action$="/replay"] input[name="operator"]`, "bob", chromedp.ByQuery),
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
	var discardMsg, discardStatus string
	err = chromedp.Run(ctx,
		chromedp.Navigate(base+"/dlq?order=WEB2"),
		chromedp.WaitVisible(`tr[data-order="WEB2"]`, chromedp.ByQuery),
		chromedp.Click(`tr[data-order="WEB2"] a`, chromedp.ByQuery),
		chromedp.WaitVisible("#discard", chromedp.ByID),
		chromedp.SendKeys(`form[action$="/discard"] input[name="operator"]`, "carol", chromedp.ByQuery),
		chromedp.SendKeys("#discard-reason", "malformed by the producer", chromedp.ByID),
		chromedp.Click("#discard", chromedp.ByID),
		chromedp.WaitVisible("#msg", chromedp.ByID),
		chromedp.Text("#msg", &discardMsg, chromedp.ByID),
		chromedp.Text("#status", &discardStatus, chromedp.ByID),
	)
	if err != nil {
		t.Fatalf("browser discard: %v", err)
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
