package listener_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/scratch"
	"github.com/paysvc/paysvc/internal/testenv"
)

// stall is how long MySQL stops committing writes in
// TestWriteStallsSpendNoAttempt: several handling bounds (stallBound).
const (
	stall      = 15 * time.Second
	stallBound = 2 * time.Second
)

// MySQL answers reads but commits no write, for several handling bounds:
// a global read lock (a backup tool's FLUSH TABLES WITH READ LOCK), a
// metadata lock on a payment table (LOCK TABLES ... WRITE from another
// session; an ALTER waiting for its lock does the same), a network path
// that loses every writing statement. With short retry settings each
// payment would spend its attempts within the stall if a timed-out payment
// counted as its own failure. Consumption pauses instead, saying why (the
// write probe), nothing is parked, nothing spends an attempt, and every
// payment is applied once after the stall.
func TestWriteStallsSpendNoAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// stall starts the stall on the test's database, and returns what
		// ends it. dsn is the database's; proxy is in front of its server.
		stall func(t *testing.T, db *sqlx.DB, proxy *testenv.Proxy) (end func())
		// own: the test needs a server of its own (a global lock).
		own bool
	}{
		{"global-read-lock", func(t *testing.T, db *sqlx.DB, _ *testenv.Proxy) func() {
			return holdLock(t, db, "FLUSH TABLES WITH READ LOCK")
		}, true},
		{"metadata-lock", func(t *testing.T, db *sqlx.DB, _ *testenv.Proxy) func() {
			return holdLock(t, db, "LOCK TABLES t_account WRITE")
		}, false},
		{"writes-black-holed", func(t *testing.T, _ *sqlx.DB, proxy *testenv.Proxy) func() {
			proxy.BlackholeWhen(isWrite)
			return func() { proxy.BlackholeWhen(nil) }
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			if tc.own {
				e.dsn, e.db = privateDatabase(t)
			}
			e.declare()
			proxy, dsn := testenv.MySQLProxy(t, e.dsn)
			const n = 24
			e.seedAccount(61, "100.00")
			msgs := e.seedOrders("STL%02d", 61, n)
			c := e.start(e.redisAddr, dsn, func(cfg *setup) {
				cfg.HandleTimeout = stallBound
				cfg.Workers, cfg.Prefetch = 16, 32 // every payment in hand: each times out once a bound
				cfg.Retry = listener.RetryPolicy{Delays: e.delays, MaxAttempts: 2}
			})
			testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
			e.publish(msgs[:4]...)
			testenv.Eventually(t, 20*time.Second, func() bool { return e.totalFlows() == 4 }, "payments before the stall not applied")

			end := tc.stall(t, e.db, proxy)
			started := time.Now()
			e.publish(msgs[4:]...)
			stalled := func() float64 {
				return testutil.ToFloat64(e.metrics.PauseReason.WithLabelValues(string(listener.ReasonMySQLWritesStalled)))
			}
			testenv.Eventually(t, stall, func() bool { return stalled() == 1 && !c.Ready() },
				"the stall did not pause consumption as mysql_writes_stalled")
			if got := c.PauseReason(); got != "MySQL does not commit writes" {
				t.Fatalf("pause reason %q", got)
			}
			time.Sleep(time.Until(started.Add(stall))) // the stall lasts its time: several handling bounds
			if got := e.totalFlows(); got != 4 {
				t.Fatalf("%d flows during the stall: the stall did not hold the writes", got)
			}
			end()

			testenv.Eventually(t, 60*time.Second, func() bool { return e.totalFlows() == n && e.depth(listener.MainQueue) == 0 },
				"not every payment applied after the stall")
			testenv.Eventually(t, 10*time.Second, c.Ready, "consumption did not resume")
			if stalled() != 0 {
				t.Fatal("paysvc_pause_reason{reason=\"mysql_writes_stalled\"} still 1 after the stall")
			}
			for i := range n {
				if no := fmt.Sprintf("STL%02d", i); e.status(no) != order.Paid || e.flows(no) != 1 {
					t.Fatalf("%s: %s with %d flows", no, e.status(no), e.flows(no))
				}
			}
			if b := e.balance(61); b != 10000-n*100 {
				t.Fatalf("balance %s, want %d cents", b, 10000-n*100)
			}
			if r := e.results(); r["RETRY"] != 0 || r["TERMINAL"] != 0 || e.depth(listener.TerminalQueue) != 0 {
				t.Fatalf("outcomes %v, terminal queue %d: the stall spent attempts", r, e.depth(listener.TerminalQueue))
			}
		})
	}
}

// holdLock runs stmt (a lock) on a connection of its own and returns what
// releases it (UNLOCK TABLES, then the connection's close).
func holdLock(t *testing.T, db *sqlx.DB, stmt string) func() {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, stmt); err != nil {
		conn.Close()
		t.Fatalf("%s: %v", stmt, err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			conn.ExecContext(ctx, "UNLOCK TABLES")
			conn.Close()
		}
	}
	t.Cleanup(release)
	return release
}

// isWrite matches a client chunk carrying a writing statement (COM_QUERY):
// reads go through.
func isWrite(toServer []byte) bool {
	for _, w := range []string{"\x03START TRANSACTION", "\x03INSERT", "\x03UPDATE", "\x03COMMIT", "\x03DELETE"} {
		if bytes.Contains(toServer, []byte(w)) {
			return true
		}
	}
	return false
}

// privateDatabase starts a MariaDB of the test's own (a global lock there
// stops no other test) and returns a migrated database on it.
func privateDatabase(t *testing.T) (string, *sqlx.DB) {
	t.Helper()
	addr := testenv.MariaDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := scratch.NewDatabase(ctx, "root@tcp("+addr+")/", testenv.Name(t), 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d.DSN, d.DB
}
