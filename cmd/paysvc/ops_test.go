package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/testenv"
)

const adminToken = "test-admin-token-0123456789"

// Named operators of the admin pages in the tests.
const (
	bobToken   = "bob-token-0123456789abcdef"
	carolToken = "carol-token-0123456789abcdef"
)

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// daemonInProcess runs `paysvc run` through run() until the test ends.
func (w *world) daemonInProcess(extra ...string) (httpAddr string, logs *lockedBuffer) {
	w.t.Helper()
	httpAddr = freeAddr(w.t)
	logs = &lockedBuffer{}
	env := w.env(append([]string{"PAYSVC_HTTP_ADDR=" + httpAddr, "PAYSVC_ADMIN_TOKEN=" + adminToken,
		"PAYSVC_ADMIN_OPERATORS=bob:" + bobToken + ",carol:sha256:" + sha256hex(carolToken),
		"PAYSVC_METRICS_QUEUEINTERVAL=200ms"}, extra...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"run"}, env, logs) }()
	w.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				w.t.Errorf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			w.t.Error("daemon did not stop")
		}
		if w.t.Failed() {
			w.t.Logf("daemon output:\n%s", logs)
		}
	})
	testenv.Eventually(w.t, 20*time.Second, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, "daemon never ready")
	return httpAddr, logs
}

// cli runs one operator command through run() and returns its output.
func (w *world) cli(args ...string) (string, error) {
	var out bytes.Buffer
	err := run(context.Background(), args, w.env("USER=tester"), &out)
	return out.String(), err
}

func (w *world) mustCLI(args ...string) string {
	w.t.Helper()
	out, err := w.cli(args...)
	if err != nil {
		w.t.Fatalf("paysvc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// webhook records alerts.
type webhook struct {
	mu     sync.Mutex
	alerts []deadletter.Alert
}

func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var a deadletter.Alert
	json.NewDecoder(r.Body).Decode(&a)
	h.mu.Lock()
	h.alerts = append(h.alerts, a)
	h.mu.Unlock()
}

func (h *webhook) forOrder(orderNo string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, a := range h.alerts {
		if a.OrderNo == orderNo {
			n++
		}
	}
	return n
}

// The operator's loop: failures are parked as dead letters with one alert per
// order, listed, shown, dry-run, replayed after a top-up (ending PAID),
// discarded, traced, and counted in /metrics.
func TestOperationsDeadLettersReplayTrace(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	hook := &webhook{}
	srv := httptest.NewServer(hook)
	defer srv.Close()
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (21, 1.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('OPS1', 21, 5.00)")
	httpAddr, _ := w.daemonInProcess("PAYSVC_RETRY_MAXATTEMPTS=1", "PAYSVC_ALERT_WEBHOOKURL="+srv.URL)

	pay := payment("OPS1", 21, "5.00")
	testenv.Publish(t, w.amqpURL, listener.MainQueue, pay, pay, []byte(`{"orderNo":"OPS2","userId":21,"amount":"1.001"}`))
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'OPS1' AND parked_count = 2") == 1 &&
			w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'OPS2'") == 1
	}, "dead letters not parked (both copies of OPS1, and OPS2)")
	testenv.Eventually(t, 10*time.Second, func() bool { return hook.forOrder("OPS1") >= 1 && hook.forOrder("OPS2") == 1 }, "no alert")
	if n := hook.forOrder("OPS1"); n != 1 {
		t.Fatalf("%d alerts for OPS1, want one per order", n)
	}
	if d := testenv.Depth(t, w.amqpURL, listener.TerminalQueue); d != 0 {
		t.Fatalf("%d messages left in the terminal queue", d)
	}

	out := w.mustCLI("dlq", "list")
	if !strings.Contains(out, "OPS1") || !strings.Contains(out, "balance_not_enough") || !strings.Contains(out, "OPS2") {
		t.Fatalf("dlq list:\n%s", out)
	}
	out = w.mustCLI("dlq", "list", "--class", "bad_message", "--since", "1h", "--status", "NEW")
	if strings.Contains(out, "OPS1") || !strings.Contains(out, "OPS2") {
		t.Fatalf("dlq list --class bad_message:\n%s", out)
	}
	out = w.mustCLI("dlq", "show", "OPS1")
	if !strings.Contains(out, string(pay)) || !strings.Contains(out, "PARKED") || !strings.Contains(out, "parked_count     2") {
		t.Fatalf("dlq show:\n%s", out)
	}
	out = w.mustCLI("dlq", "replay", "OPS1", "--dry-run", "--reason", "check")
	if !strings.Contains(out, "would fail: balance 1.00 < amount 5.00") {
		t.Fatalf("dry run before top-up:\n%s", out)
	}
	if _, err := w.cli("dlq", "replay", "OPS1"); err == nil || !strings.Contains(err.Error(), "--reason") {
		t.Fatalf("replay without a reason: %v", err)
	}
	w.db.MustExec("UPDATE t_account SET balance = 10.00 WHERE user_id = 21")
	out = w.mustCLI("dlq", "replay", "--class", "balance_not_enough", "--dry-run", "--reason", "check")
	if !strings.Contains(out, "would deduct 5.00 from user 21 (balance 10.00 → 5.00)") {
		t.Fatalf("dry run after top-up:\n%s", out)
	}
	if w.count("SELECT COUNT(*) FROM t_dead_letter_event WHERE event = 'REPLAYED'") != 0 {
		t.Fatal("a dry run wrote an audit row")
	}
	out = w.mustCLI("dlq", "replay", "OPS1", "--reason", "customer topped up", "--operator", "alice")
	if !strings.Contains(out, "replayed to q.pay.success") {
		t.Fatalf("replay:\n%s", out)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'OPS1' AND status = 'PAID'") == 1
	}, "replayed payment not applied")
	if w.count(`SELECT COUNT(*) FROM t_dead_letter d JOIN t_dead_letter_event e ON e.dead_letter_id = d.id
		WHERE d.order_no = 'OPS1' AND d.status = 'REPLAYED' AND e.event = 'REPLAYED' AND e.operator = 'alice'
		AND e.reason = 'customer topped up'`) != 1 {
		t.Fatal("no REPLAYED status and audit row")
	}
	out = w.mustCLI("dlq", "replay", "OPS1", "--reason", "again")
	if !strings.Contains(out, "skipped: already replayed") {
		t.Fatalf("second replay:\n%s", out)
	}
	out = w.mustCLI("dlq", "discard", "OPS2", "--reason", "malformed by the producer")
	if !strings.Contains(out, "discarded") || w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'OPS2' AND status = 'DISCARDED'") != 1 {
		t.Fatalf("discard:\n%s", out)
	}

	out = w.mustCLI("trace", "OPS1")
	for _, want := range []string{"created: user 21", "RETRY attempt 1 (balance_not_enough)", "TERMINAL", "PARKED",
		"REPLAYED by alice", "INIT → PAID", "PAY_DEDUCT -5.00", "payment notice queued"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q:\n%s", want, out)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return testenv.Depth(t, w.amqpURL, outbox.Queue) == 1
	}, "the payment notice was not published")

	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`paysvc_messages_total{result="TERMINAL"} 3`, `paysvc_messages_total{result="FIRST"} 1`,
		`paysvc_errors_total{class="balance_not_enough"}`, "paysvc_handle_duration_seconds_bucket",
		`paysvc_queue_messages{queue="q.pay.success"}`, `paysvc_ready 1`, "paysvc_terminal_pending"} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// Every payment transaction is counted, a lone payment as a group of 1.
	if m := regexp.MustCompile(`paysvc_pay_group_size_count (\d+)`).FindSubmatch(metrics); m == nil || string(m[1]) == "0" {
		t.Errorf("/metrics: paysvc_pay_group_size counted no transaction (%q)", m)
	}
}

// Reconcile from the command line, on legacy data from before the unique
// index: exit status 2 on problems, --fix books a reversal once, a second run
// is clean, and migrate keeps refusing to add the index until the reversed
// duplicate is moved out.
func TestReconcileCommandOnLegacyDuplicates(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	w.db.MustExec("DELETE FROM paysvc_schema_migrations WHERE version = 3")
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (31, 90.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount, status) VALUES ('RC1', 31, 5.00, 'PAID')")
	w.db.MustExec("INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES (31, -5.00, 'RC1', 'PAY_DEDUCT'), (31, -5.00, 'RC1', 'PAY_DEDUCT')")

	if _, err := w.cli("migrate"); err == nil || !strings.Contains(err.Error(), "paysvc reconcile") {
		t.Fatalf("migrate over duplicates: %v", err)
	}
	out, err := w.cli("reconcile")
	var exit *exitError
	if !errors.As(err, &exit) || exit.code != 2 || !strings.Contains(out, "duplicate_flow") || !strings.Contains(out, "RC1") {
		t.Fatalf("reconcile: %v\n%s", err, out)
	}
	out, err = w.cli("reconcile", "--fix")
	if !errors.As(err, &exit) || exit.code != 2 || !strings.Contains(out, "reversed by RC1-REVERSE (+5.00)") {
		t.Fatalf("reconcile --fix: %v\n%s", err, out)
	}
	out = w.mustCLI("reconcile", "--fix")
	if !strings.Contains(out, "0 findings about 0 orders and 0 accounts, 1 duplicate groups already reversed") {
		t.Fatalf("second reconcile --fix:\n%s", out)
	}
	if w.count("SELECT COUNT(*) FROM t_account_flow") != 3 || w.count("SELECT COUNT(*) FROM t_account WHERE balance = 95.00") != 1 {
		t.Fatal("want the two PAY_DEDUCT rows kept, one reversal, balance 95.00")
	}
}

// The incident began when a non-critical step failed after the charge. Here
// the notice cannot be published at all (ex.pay.notify exists with another
// type): the payment is applied and acked once, never redelivered or charged
// again, and the notice goes out once the exchange is fixed.
func TestNoticeFailureNeverRedeliversOrChargesTwice(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	testenv.Declare(t, w.amqpURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclare(outbox.Exchange, amqp.ExchangeFanout, true, false, false, false, nil)
	})
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (41, 100.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('NT1', 41, 30.00)")
	_, logs := w.daemonInProcess()
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("NT1", 41, "30.00"))

	testenv.Eventually(t, 20*time.Second, func() bool {
		return strings.Count(logs.String(), "outbox dispatcher: retrying") >= 3 &&
			w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'NT1' AND status = 'PAID'") == 1
	}, "payment not applied, or the dispatcher did not fail")
	if r := resultsOf(logs.String()); r["FIRST"] != 1 || len(r) != 1 {
		t.Fatalf("outcomes %v while the notice failed: want exactly one FIRST", r)
	}
	if w.count("SELECT COUNT(*) FROM t_outbox WHERE biz_no = 'NT1' AND status = 'PENDING'") != 1 {
		t.Fatal("the notice is not pending")
	}
	if d := testenv.Depth(t, w.amqpURL, listener.MainQueue); d != 0 {
		t.Fatalf("%d messages back in the main queue", d)
	}

	testenv.Declare(t, w.amqpURL, func(ch *amqp.Channel) error {
		return ch.ExchangeDelete(outbox.Exchange, false, false)
	})
	testenv.Eventually(t, 60*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_outbox WHERE biz_no = 'NT1' AND status = 'SENT'") == 1
	}, "notice not sent after the exchange was fixed")
	got := testenv.GetAll(t, w.amqpURL, outbox.Queue)
	if len(got) != 1 || !strings.Contains(string(got[0].Body), `"orderNo":"NT1"`) || got[0].Type != outbox.EventPaymentSucceeded {
		t.Fatalf("notices %v", got)
	}
	if r := resultsOf(logs.String()); r["FIRST"] != 1 || len(r) != 1 {
		t.Fatalf("outcomes %v", r)
	}
	if w.count("SELECT COUNT(*) FROM t_account_flow WHERE biz_no = 'NT1'") != 1 ||
		w.count("SELECT COUNT(*) FROM t_account WHERE user_id = 41 AND balance = 70.00") != 1 {
		t.Fatal("charged other than once")
	}
}

func resultsOf(logs string) map[string]int {
	p := &proc{out: &lockedBuffer{}}
	p.out.Write([]byte(logs))
	return p.results()
}

// Reconciliation on a schedule inside the daemon: a balance that disagrees
// with its opening balance and flows, and a legacy order with a flow of
// another amount and no CAS (two findings), are logged and counted in
// /metrics once each.
func TestScheduledReconcile(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (61, 7.00)")
	w.db.MustExec("INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (61, 10.00, '2020-01-01')")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount, status) VALUES ('SR1', 62, 5.00, 'INIT')")
	w.db.MustExec("INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES (62, -6.00, 'SR1', 'PAY_DEDUCT')")
	addr, logs := w.daemonInProcess("PAYSVC_RECONCILE_INTERVAL=1s")
	testenv.Eventually(t, 20*time.Second, func() bool {
		return strings.Contains(logs.String(), `"findings":3,"orders":1,"accounts":1`)
	}, "the scheduled reconciliation did not report the balance and the order's two findings")
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "paysvc_reconcile_problems 2\n") {
		t.Fatal("paysvc_reconcile_problems is not 2 (an account and an order)")
	}
}

// Two different terminal messages for one (all-digit) order number: a real
// payment that ran out of balance and a copy with another amount. Both are
// kept with their own bodies and classes, each raises its alert, the admin
// page links them, and the dlq commands never pick one silently.
func TestSeveralDeadLettersForOneOrder(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	hook := &webhook{}
	srv := httptest.NewServer(hook)
	defer srv.Close()
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (23, 1.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('424242', 23, 5.00)")
	httpAddr, _ := w.daemonInProcess("PAYSVC_RETRY_MAXATTEMPTS=1", "PAYSVC_ALERT_WEBHOOKURL="+srv.URL)
	testenv.Publish(t, w.amqpURL, listener.MainQueue, payment("424242", 23, "5.00"), payment("424242", 23, "7.00"))
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = '424242'") == 2
	}, "both messages parked")
	var rows []struct {
		ID    int64  `db:"id"`
		Class string `db:"error_class"`
		Body  string `db:"body"`
	}
	if err := w.db.Select(&rows, "SELECT id, error_class, body FROM t_dead_letter WHERE order_no = '424242' ORDER BY error_class"); err != nil {
		t.Fatal(err)
	}
	if rows[0].Class != "balance_not_enough" || !strings.Contains(rows[0].Body, `5.00`) ||
		rows[1].Class != "mismatch" || !strings.Contains(rows[1].Body, `7.00`) {
		t.Fatalf("rows %+v: want each message with its own class and body", rows)
	}
	balanceID, mismatchID := fmt.Sprint(rows[0].ID), fmt.Sprint(rows[1].ID)
	testenv.Eventually(t, 10*time.Second, func() bool { return hook.forOrder("424242") == 2 }, "one alert per dead letter")

	out := w.mustCLI("dlq", "show", "424242")
	if !strings.Contains(out, "id               "+balanceID) && !strings.Contains(out, "balance_not_enough") ||
		!strings.Contains(out, "mismatch") {
		t.Fatalf("dlq show of the order does not show both:\n%s", out)
	}
	if _, err := w.cli("dlq", "replay", "424242", "--reason", "x"); err == nil || !strings.Contains(err.Error(), "--all-of-order") ||
		!strings.Contains(err.Error(), "id "+balanceID) || !strings.Contains(err.Error(), "id "+mismatchID) {
		t.Fatalf("replay by an order with two dead letters: %v; want a refusal listing both", err)
	}
	// An all-digit argument that is a row id but no order number is refused.
	if _, err := w.cli("dlq", "show", balanceID); err == nil || !strings.Contains(err.Error(), "--id "+balanceID) {
		t.Fatalf("dlq show %s: %v; want a refusal naming --id", balanceID, err)
	}
	out = w.mustCLI("dlq", "show", "--id", mismatchID)
	if !strings.Contains(out, "mismatch") || strings.Contains(out, "balance_not_enough") {
		t.Fatalf("dlq show --id %s:\n%s", mismatchID, out)
	}
	w.mustCLI("dlq", "discard", "--id", mismatchID, "--reason", "wrong amount from the producer")
	w.db.MustExec("UPDATE t_account SET balance = 10.00 WHERE user_id = 23")
	// One replayable row left for the order: naming the order is enough now.
	out = w.mustCLI("dlq", "replay", "--order", "424242", "--reason", "topped up")
	if !strings.Contains(out, balanceID) || strings.Contains(out, mismatchID+" ") {
		t.Fatalf("replay of the order replayed:\n%s", out)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = '424242' AND status = 'PAID'") == 1
	}, "the replayed payment was not applied")
	// By order number only NEW rows replay: the order's other row is
	// DISCARDED, and replaying it takes its id.
	if _, err := w.cli("dlq", "replay", "424242", "--reason", "x"); err == nil || !strings.Contains(err.Error(), "--id "+mismatchID) {
		t.Fatalf("replay by order of a DISCARDED row: %v; want a refusal naming --id %s", err, mismatchID)
	}
	if w.count("SELECT COUNT(*) FROM t_dead_letter WHERE id = "+mismatchID+" AND status = 'DISCARDED'") != 1 {
		t.Fatal("the DISCARDED row was replayed by its order number")
	}
	if n := w.count("SELECT COUNT(*) FROM t_account_flow WHERE biz_no = '424242'"); n != 1 {
		t.Fatalf("%d flows for the order, want 1", n)
	}
	if n := w.count("SELECT COUNT(*) FROM t_account WHERE user_id = 23 AND balance = 5.00"); n != 1 {
		t.Fatal("the replayed payment did not take exactly 5.00")
	}
	// The same payment parked again (a late copy) and replayed although the
	// order is PAID: a duplicate, no second flow, the balance untouched.
	store := deadletter.NewStore(w.db)
	user, amt := int64(23), money.Cents(500)
	if _, _, err := store.Park(context.Background(), deadletter.Parked{OrderNo: "424242", UserID: &user, Amount: &amt,
		Body: payment("424242", 23, "5.00"), Headers: "{}", ErrorClass: "timeout", LastError: "a late copy",
		FirstFailedAt: time.Now(), LastFailedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	w.mustCLI("dlq", "replay", "--id", balanceID, "--reason", "replayed twice by mistake")
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_payment_event WHERE order_no = '424242' AND event = 'DUPLICATE'") == 1
	}, "the replay of a paid order was not acked as a duplicate")
	if w.count("SELECT COUNT(*) FROM t_account_flow WHERE biz_no = '424242'") != 1 ||
		w.count("SELECT COUNT(*) FROM t_account WHERE user_id = 23 AND balance = 5.00") != 1 {
		t.Fatal("replaying a dead letter of a paid order moved money")
	}

	// The admin page shows the other dead letter of the order.
	req, _ := http.NewRequest("GET", "http://"+httpAddr+"/dlq/"+balanceID, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), `href="/dlq/`+mismatchID+`"`) {
		t.Fatalf("the page of dead letter %s does not link %s:\n%s", balanceID, mismatchID, page)
	}
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
