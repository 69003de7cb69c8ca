package main

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/testenv"
)

// loseCommits leaves the database as a failover to a replica that never
// received the orders' payments does: the orders INIT, their flows and
// notices gone, the balance as it was before them. Redis keeps its done
// keys; the notices already went out.
func (w *world) loseCommits(user int64, orderNos ...string) {
	w.t.Helper()
	for _, no := range orderNos {
		w.db.MustExec("UPDATE t_account a JOIN t_account_flow f ON f.user_id = a.user_id SET a.balance = a.balance - f.amount WHERE f.biz_no = ? AND f.type = 'PAY_DEDUCT'", no)
		w.db.MustExec("DELETE FROM t_account_flow WHERE biz_no = ?", no)
		w.db.MustExec("DELETE FROM t_outbox WHERE biz_no = ?", no)
		w.db.MustExec("UPDATE t_order SET status = 'INIT', pay_time = NULL WHERE order_no = ? AND user_id = ?", no, user)
	}
}

func (w *world) metric(addr, name string) string {
	w.t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(b); m != nil {
		return string(m[1])
	}
	return ""
}

// lostIn lists the lost_payment findings of reconcile --output json.
func lostIn(t *testing.T, out string) (orders []string, fixed int) {
	t.Helper()
	var rep reconcileJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("reconcile --output json: %v\n%s", err, out)
	}
	for _, p := range rep.Problems {
		if p.Kind == "lost_payment" {
			orders = append(orders, *p.OrderNo)
			if p.Fixed {
				fixed++
			}
		}
	}
	slices.Sort(orders)
	return orders, fixed
}

// Payments paysvc applied and a database failover lost: the daemon counts
// them (paysvc_lost_payments) and names each in its log; trace says so;
// reconcile lists them from the done keys and from a copy of the notices;
// an upstream retry of one applies it once; reconcile --fix re-drives the
// others through the main queue with the operator and reason in their
// history, each applied once; the count falls to 0, reconcile is clean,
// and a redelivery of every payment is a duplicate.
func TestLostPaymentsFoundAndReDrivenOnce(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (81, 100.00)")
	w.db.MustExec("INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (81, 100.00, '2020-01-01')")
	w.db.MustExec(`INSERT INTO t_order (order_no, user_id, amount) VALUES
		('LF1', 81, 10.00), ('LF2', 81, 20.00), ('LF3', 81, 5.00), ('LF4', 81, 7.00)`)
	// The shared Redis may hold many keys of other tests: a walk at the
	// default rate could outlast the test's deadlines.
	addr, logs := w.daemonInProcess("PAYSVC_RECONCILE_LOSTSWEEPRATE=1000000")
	pays := [][]byte{payment("LF1", 81, "10.00"), payment("LF2", 81, "20.00"), payment("LF3", 81, "5.00"), payment("LF4", 81, "7.00")}
	testenv.Publish(t, w.amqpURL, listener.MainQueue, pays...)
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'") == 4 && testenv.Depth(t, w.amqpURL, outbox.Queue) == 4
	}, "payments not applied and notified")
	notices := testenv.GetAll(t, w.amqpURL, outbox.Queue) // the copy an operator keeps

	w.loseCommits(81, "LF1", "LF2", "LF3")
	testenv.Eventually(t, 20*time.Second, func() bool { return w.metric(addr, "paysvc_lost_payments") == "3" },
		"paysvc_lost_payments is %q, want 3", w.metric(addr, "paysvc_lost_payments"))
	for _, no := range []string{"LF1", "LF2", "LF3"} {
		if !strings.Contains(logs.String(), `"msg":"payment lost: its Redis key says done, the database does not have it`) ||
			!strings.Contains(logs.String(), `"order_no":"`+no+`","user_id":81`) {
			t.Fatalf("no log line names the lost %s", no)
		}
	}
	if out := w.mustCLI("trace", "LF1"); !strings.Contains(out, "the order is INIT while its Redis key says done") {
		t.Fatalf("trace of a lost order:\n%s", out)
	}

	// An upstream retry of LF3: applied once, a done key on an INIT order
	// being no duplicate.
	testenv.Publish(t, w.amqpURL, listener.MainQueue, pays[2])
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE order_no = 'LF3' AND status = 'PAID'") == 1
	}, "the retried LF3 was not applied")

	out, err := w.cli("reconcile", "--output", "json")
	var exit *exitError
	if lost, _ := lostIn(t, out); !errors.As(err, &exit) || exit.code != exitProblems || !slices.Equal(lost, []string{"LF1", "LF2"}) {
		t.Fatalf("reconcile: %v, lost %v, want LF1 and LF2\n%s", err, lost, out)
	}
	if !strings.Contains(out, `"amount": "20.00"`) {
		t.Fatalf("reconcile --output json lacks LF2's amount:\n%s", out)
	}
	file := filepath.Join(t.TempDir(), "notices.jsonl")
	var lines []string
	for _, d := range notices {
		lines = append(lines, string(d.Body))
	}
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ = w.cli("reconcile", "--skip-redis", "--notices", file, "--output", "json")
	if lost, _ := lostIn(t, out); !slices.Equal(lost, []string{"LF1", "LF2"}) {
		t.Fatalf("reconcile --notices: lost %v, want LF1 and LF2\n%s", lost, out)
	}

	out, _ = w.cli("reconcile", "--fix", "--reason", "db1 failed over to db2", "--operator", "carol", "--output", "json")
	if lost, fixed := lostIn(t, out); !slices.Equal(lost, []string{"LF1", "LF2"}) || fixed != 2 {
		t.Fatalf("reconcile --fix: lost %v, %d re-driven\n%s", lost, fixed, out)
	}
	testenv.Eventually(t, 20*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'") == 4
	}, "the re-driven payments were not applied")
	testenv.Eventually(t, 20*time.Second, func() bool { return w.metric(addr, "paysvc_lost_payments") == "0" },
		"paysvc_lost_payments is %q after the re-drive, want 0", w.metric(addr, "paysvc_lost_payments"))
	if out := w.mustCLI("reconcile"); !strings.Contains(out, "0 findings about 0 orders and 0 accounts") {
		t.Fatalf("reconcile after the re-drive:\n%s", out)
	}
	out = w.mustCLI("trace", "LF1")
	for _, want := range []string{"PARKED by paysvc (lost_commit)", "REPLAYED by carol, reason: db1 failed over to db2",
		"INIT → PAID", "PAY_DEDUCT -10.00"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace of the re-driven LF1 lacks %q:\n%s", want, out)
		}
	}

	// Every payment again: duplicates all.
	testenv.Publish(t, w.amqpURL, listener.MainQueue, pays...)
	testenv.Eventually(t, 20*time.Second, func() bool { return resultsOf(logs.String())["DUPLICATE"] == 4 },
		"outcomes %v, want 4 duplicates", resultsOf(logs.String()))
	if r := resultsOf(logs.String()); r["FIRST"] != 4+3 {
		t.Fatalf("outcomes %v: want 7 FIRST (4, then LF3 retried, LF1 and LF2 re-driven)", r)
	}
	if w.count("SELECT COUNT(*) FROM t_account_flow WHERE type = 'PAY_DEDUCT'") != 4 ||
		w.count("SELECT COUNT(*) FROM t_account WHERE user_id = 81 AND balance = 58.00") != 1 {
		t.Fatal("want one flow per order and 100.00 - 42.00 left")
	}
}
