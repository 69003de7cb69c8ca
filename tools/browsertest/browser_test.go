package browsertest

import (
	"context"
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
	addr := w.daemon("PAYSVC_RETRY_MAXATTEMPTS=0")
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

// Bulk actions in the browser: the list counts NEW dead letters by class
// and charts them by day; two selected rows are discarded after a dry run
// that changes nothing, then a whole class is replayed the same way; the
// audit trail names the signed-in operator on every row.
func TestAdminBulkActionsInBrowser(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (61, 1.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('BK1', 61, 5.00), ('BK2', 61, 6.00)")
	addr := w.daemon("PAYSVC_RETRY_MAXATTEMPTS=0")
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
