package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
)

// jsonLines parses every line of out as a log entry; a line that is not a
// JSON object with level, ts and msg fails the test.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var entries []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("a line is not JSON (%v):\n%s", err, sc.Text())
		}
		for _, k := range []string{"level", "ts", "msg"} {
			if _, ok := e[k]; !ok {
				t.Fatalf("a line has no %q:\n%s", k, sc.Text())
			}
		}
		entries = append(entries, e)
	}
	return entries
}

// In json mode every line paysvc writes, on stdout and stderr, is a JSON
// entry: its own, the client libraries' (their loggers are routed through
// zap), and the reason it stops.
func TestEveryLineIsJSON(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	redisProxy := testenv.NewProxy(t, testenv.RedisAddr())
	cfg, err := mysql.ParseDSN(w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (61, 100.00)")
	for i := range 20 {
		w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, 61, 1.00)", fmt.Sprintf("JS%02d", i))
	}
	p := w.start(w.env("PAYSVC_REDIS_ADDR="+redisProxy.Addr(), "PAYSVC_LOG_FORMAT=json"), "run")
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			testenv.Publish(t, w.amqpURL, listener.MainQueue, payment(fmt.Sprintf("JS%02d", i), 61, "1.00"))
		}
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return testenv.QueueExists(t, w.amqpURL, listener.MainQueue) }, "never declared")
	publish(0, 5)
	testenv.Eventually(t, 20*time.Second, func() bool { return w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'") == 5 }, "first payments")

	// Redis goes away for a while: go-redis logs its dial failures.
	redisProxy.Down()
	publish(5, 10)
	testenv.Eventually(t, 20*time.Second, func() bool { return strings.Contains(p.out.String(), `"lib":"go-redis"`) },
		"go-redis never logged its dial failures")
	redisProxy.Up()
	testenv.Eventually(t, 30*time.Second, func() bool { return w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'") == 10 }, "payments after Redis came back")

	// Its MySQL connections are killed: the driver logs the bad connections.
	var ids []int64
	if err := w.db.Select(&ids, "SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()", cfg.DBName); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		w.db.Exec("KILL CONNECTION ?", id)
	}
	publish(10, 20)
	testenv.Eventually(t, 30*time.Second, func() bool { return w.count("SELECT COUNT(*) FROM t_order WHERE status = 'PAID'") == 20 }, "payments after the kill")
	testenv.Eventually(t, 10*time.Second, func() bool { return strings.Contains(p.out.String(), `"lib":"go-sql-driver/mysql"`) },
		"the MySQL driver never logged the killed connections")
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.wait(t, 30*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	entries := jsonLines(t, p.out.String())
	if len(entries) < 20 {
		t.Fatalf("only %d log lines", len(entries))
	}

	// A start-up failure is the last entry, with its exit code.
	bad := w.start(w.env("PAYSVC_AMQP_PREFETCH=0"), "run")
	if err := bad.wait(t, 10*time.Second); err == nil {
		t.Fatal("a bad configuration started")
	}
	entries = jsonLines(t, bad.out.String())
	last := entries[len(entries)-1]
	if last["level"] != "error" || last["exit_code"] != float64(1) || !strings.Contains(fmt.Sprint(last["error"]), "amqp.prefetch") {
		t.Fatalf("last entry %v: want the error naming amqp.prefetch, with exit_code 1", last)
	}
}
