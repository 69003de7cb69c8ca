package sqldb_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// balancer is a load balancer in front of two servers: the shared one (A),
// which runs the test's database, and a mariadbd of the test's own (B),
// with an empty database of the same name, where a thread id of A is some
// other connection's.
type balancer struct {
	proxy        *testenv.Proxy
	dsn          string // the test's database, through the proxy
	a, b         *sqlx.DB
	addrA, addrB string
}

// newBalancer starts B and a proxy that sends new connections to A until
// told otherwise (SetTarget).
func newBalancer(t *testing.T) balancer {
	t.Helper()
	dsn, a := testenv.MySQL(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	addrB := testenv.MariaDB(t)
	b, err := sqldb.Open(context.Background(), "root@tcp("+addrB+")/", 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	b.MustExec("CREATE DATABASE " + cfg.DBName)
	proxy, proxied := testenv.MySQLProxy(t, dsn)
	return balancer{proxy: proxy, dsn: proxied, a: a, b: b, addrA: cfg.Addr, addrB: addrB}
}

// status is one of the server's global status counters.
func status(t *testing.T, db *sqlx.DB, name string) int {
	t.Helper()
	var n int
	if err := db.Get(&n, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = ?", name); err != nil {
		t.Fatal(err)
	}
	return n
}

// lockedRow inserts user 1's account on A and locks it until the test ends
// (or the returned release).
func lockedRow(t *testing.T, a *sqlx.DB) (release func()) {
	t.Helper()
	a.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 10.00)")
	holder := a.MustBegin()
	t.Cleanup(func() { holder.Rollback() })
	holder.MustExec("SELECT balance FROM t_account WHERE user_id = 1 FOR UPDATE")
	return func() { holder.Rollback() }
}

// waitOnA opens a pool of one connection, on A, sends the balancer's new
// connections to B, and runs a transaction on A whose statement waits for
// user 1's row until its context ends.
func waitOnA(t *testing.T, lb balancer, opts sqldb.Options) {
	t.Helper()
	opts.MaxOpen, opts.LockWait = 1, 30*time.Second
	pool, err := sqldb.OpenWith(context.Background(), lb.dsn, opts) // its connection is on A
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	lb.proxy.SetTarget(lb.addrB)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = sqldb.InTx(ctx, pool, func(tx *sqldb.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE t_account SET balance = balance - 1 /* kill-me */ WHERE user_id = 1")
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("transaction = %v, want the context's deadline", err)
	}
}

// Behind a load balancer, the side connection that kills a cancelled
// statement may reach another server, where the thread id is another
// connection's: no KILL is sent there, and the side connection is dialled
// again until it reaches the statement's server, which the KILL then ends.
func TestKillOnlyOnTheStatementsServer(t *testing.T) {
	t.Parallel()
	lb := newBalancer(t)
	lockedRow(t, lb.a)
	kills, conns := status(t, lb.b, "COM_KILL"), status(t, lb.b, "CONNECTIONS")
	waitOnA(t, lb, sqldb.Options{})

	testenv.Eventually(t, 10*time.Second, func() bool {
		return status(t, lb.b, "COM_KILL") > kills || status(t, lb.b, "CONNECTIONS") >= conns+2
	}, "no two side connections reached B")
	if n := status(t, lb.b, "COM_KILL") - kills; n != 0 {
		t.Fatalf("%d KILL ran on B, where the thread id is not the statement's", n)
	}
	if !processlistHas(t, lb.a, "kill-me") {
		t.Fatal("the statement on A ended though no side connection reached A")
	}

	lb.proxy.SetTarget(lb.addrA)
	testenv.Eventually(t, 10*time.Second, func() bool { return !processlistHas(t, lb.a, "kill-me") },
		"once side connections reach A the statement still runs there: %s", processlist(t, lb.a, "kill-me"))
	if n := status(t, lb.b, "COM_KILL") - kills; n != 0 {
		t.Fatalf("%d KILL ran on B, where the thread id is not the statement's", n)
	}
}

// A kill whose side connections never reach the statement's server kills
// nothing and says so; the server then ends the transaction itself: once
// its lock wait ends, the statement finds its client gone and rolls back.
func TestKillGivesUpWhenNoSideConnectionReachesTheServer(t *testing.T) {
	t.Parallel()
	lb := newBalancer(t)
	release := lockedRow(t, lb.a)
	kills := status(t, lb.b, "COM_KILL")
	core, logs := observer.New(zap.WarnLevel)
	waitOnA(t, lb, sqldb.WithKillTimeout(sqldb.Options{Log: zap.New(core)}, 2*time.Second))

	testenv.Eventually(t, 10*time.Second, func() bool {
		return logs.FilterMessageSnippet("not killed").Len() > 0 || status(t, lb.b, "COM_KILL") > kills
	}, "the kill neither gave up nor ran")
	if n := status(t, lb.b, "COM_KILL") - kills; n != 0 {
		t.Fatalf("%d KILL ran on B, where the thread id is not the statement's", n)
	}
	entry := logs.FilterMessageSnippet("not killed").All()[0]
	if err, _ := entry.ContextMap()["error"].(string); !strings.Contains(err, "side connection reached") {
		t.Fatalf("logged %q %v, want the side connection's other server named", entry.Message, entry.ContextMap())
	}
	if !processlistHas(t, lb.a, "kill-me") {
		t.Fatal("the statement on A ended though no side connection reached A")
	}

	release()
	testenv.Eventually(t, 10*time.Second, func() bool {
		tx := lb.a.MustBegin()
		defer tx.Rollback()
		tx.MustExec("SET SESSION innodb_lock_wait_timeout = 1")
		var bal string
		return tx.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1 FOR UPDATE") == nil && bal == "10.00"
	}, "the server did not roll back the abandoned transaction")
}

// A proxy that answers SELECT CONNECTION_ID() itself (ProxySQL) gives an id
// of its own, which its KILL takes to mean its own sessions, maybe another
// proxy's: such a connection is never killed, and that is logged.
func TestConnectionIDAnsweredByAProxyIsNeverKilled(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	lockedRow(t, db)
	proxy, proxied := testenv.MySQLProxy(t, dsn)
	proxy.ReplaceQuery("SELECT CONNECTION_ID()", "SELECT 900000000000001")
	core, logs := observer.New(zap.WarnLevel)
	pool, err := sqldb.OpenWith(context.Background(), proxied, sqldb.Options{MaxOpen: 1, LockWait: 30 * time.Second, Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := pool.ExecContext(ctx, "UPDATE t_account SET balance = balance - 1 /* kill-me */ WHERE user_id = 1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("update = %v, want the context's deadline", err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return logs.FilterMessageSnippet("a proxy answers").Len() > 0 },
		"no word of the kill left to the proxy")
	if !processlistHas(t, db, "kill-me") {
		t.Fatal("the statement was killed")
	}
}
