package sqldb_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// The connection dies before COMMIT reaches the server: InTx must report the
// outcome as unknown, never as success.
func TestInTxReportsCommitUnknown(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 10.00)")
	err := sqldb.InTx(context.Background(), db, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(context.Background(), "UPDATE t_account SET balance = 5.00 WHERE user_id = 1"); err != nil {
			return err
		}
		var id int64
		if err := tx.GetContext(context.Background(), &id, "SELECT CONNECTION_ID()"); err != nil {
			return err
		}
		if _, err := db.Exec("KILL CONNECTION ?", id); err != nil {
			return err
		}
		testenv.Eventually(t, 5*time.Second, func() bool {
			var n int
			db.Get(&n, "SELECT COUNT(*) FROM information_schema.processlist WHERE id = ?", id)
			return n == 0
		}, "connection %d not killed", id)
		return nil
	})
	if !errors.Is(err, sqldb.ErrCommitUnknown) {
		t.Fatalf("InTx = %v, want ErrCommitUnknown", err)
	}
	var bal string
	db.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1")
	if bal != "10.00" {
		t.Fatalf("balance %s: the killed transaction was applied", bal)
	}
}

func TestInTxRollsBackOnError(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 10.00)")
	boom := errors.New("boom")
	err := sqldb.InTx(context.Background(), db, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(context.Background(), "UPDATE t_account SET balance = 5.00 WHERE user_id = 1"); err != nil {
			return err
		}
		return boom
	})
	var bal string
	db.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1")
	if !errors.Is(err, boom) || bal != "10.00" {
		t.Fatalf("InTx = %v, balance %s; want boom and 10.00", err, bal)
	}
}

// The server's own errors, sorted: a value the table refuses is a data
// error (writing it again fails again); a server refusing a new connection
// (max_user_connections here) is a connection problem, held as an outage,
// and never a data error.
func TestServerErrorsSorted(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	ctx := context.Background()
	_, err := db.ExecContext(ctx, "INSERT INTO t_account (user_id, balance) VALUES (1, 1234567890123456789012345.00)")
	if err == nil || !sqldb.IsDataRejected(err) || sqldb.IsConnection(err) {
		t.Fatalf("an out-of-range balance: %v; want a data error", err)
	}

	user := "ms_" + testenv.Name(t)[len(testenv.Name(t))-8:]
	db.MustExec("CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw' WITH MAX_USER_CONNECTIONS 1")
	t.Cleanup(func() { db.Exec("DROP USER IF EXISTS '" + user + "'@'%'") })
	db.MustExec("GRANT SELECT ON *.* TO '" + user + "'@'%'")
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = user, "pw"
	limited, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer limited.Close()
	held, err := limited.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	second, err := limited.Conn(ctx)
	if err == nil {
		second.Close()
		t.Fatal("a second connection past MAX_USER_CONNECTIONS 1 was accepted")
	}
	if !sqldb.IsConnection(err) || sqldb.IsDataRejected(err) {
		t.Fatalf("a connection refused by max_user_connections: %v; want a connection error, not a data error", err)
	}
}

// A locking clause the server does not know is a syntax error (as SKIP
// LOCKED is before MariaDB 10.6 and MySQL 8.0), which order.Grouper takes
// as "do not ask again"; the servers paysvc runs on know SKIP LOCKED.
func TestSyntaxErrorRecognised(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	var ids []int64
	if err := db.Select(&ids, "SELECT user_id FROM t_account WHERE user_id IN (1, 2) FOR UPDATE SKIP LOCKED"); err != nil {
		t.Fatalf("SKIP LOCKED: %v", err)
	}
	err := db.Select(&ids, "SELECT user_id FROM t_account WHERE user_id IN (1, 2) FOR UPDATE SKIP LOCKS")
	if !sqldb.IsSyntax(err) {
		t.Fatalf("an unknown locking clause: %v, want a syntax error", err)
	}
	if sqldb.IsSyntax(&mysql.MySQLError{Number: 1205}) {
		t.Fatal("a lock wait timeout taken for a syntax error")
	}
}

// A lock wait timeout is 1205, and on TiDB also the bare 1105 "lock wait
// timeout" it answers when a pessimistic write conflict is found after the
// whole wait; no other 1105 is one.
func TestLockWaitRecognised(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded; try restarting transaction"}, true},
		{fmt.Errorf("order X: pay: %w", &mysql.MySQLError{Number: 1105, Message: "lock wait timeout"}), true},
		{&mysql.MySQLError{Number: 1105, Message: "runtime error: invalid memory address or nil pointer dereference"}, false},
		{&mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}, false},
		{errors.New("lock wait timeout"), false},
	} {
		if got := sqldb.IsLockWait(tc.err); got != tc.want {
			t.Errorf("IsLockWait(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestDuplicateKeyName(t *testing.T) {
	for msg, want := range map[string]string{
		"Duplicate entry 'P1-PAY_DEDUCT' for key 'uk_biz_no_type'":                         "uk_biz_no_type",
		"Duplicate entry 'P1-PAY_DEDUCT' for key 't_account_flow.uk_biz_no_type'":          "uk_biz_no_type",
		"Duplicate entry 'Xuk_biz_no_type1-PAYMENT_SUCCEEDED' for key 'uk_biz_no_event'":   "uk_biz_no_event",
		"Duplicate entry 'x' for key 'uk_biz_no_type'' for key 't_outbox.uk_biz_no_event'": "uk_biz_no_event",
		"Duplicate entry 'x' for key 'PRIMARY'":                                            "PRIMARY",
		"something else":                                                                   "",
	} {
		if got := sqldb.DuplicateKey(&mysql.MySQLError{Number: 1062, Message: msg}); got != want {
			t.Errorf("DuplicateKey(%q) = %q, want %q", msg, got, want)
		}
	}
	if got := sqldb.DuplicateKey(&mysql.MySQLError{Number: 1406, Message: "for key 'uk_biz_no_type'"}); got != "" {
		t.Errorf("DuplicateKey of a 1406 = %q, want none", got)
	}
}

// A named lock outlives its connection's idle timeout: on MySQL, OpenWith
// sets wait_timeout to the idle-transaction bound on every connection, and
// a holder working on other connections would otherwise lose the lock
// without a word (wait_timeout 1 s here, in the DSN, on MariaDB too).
func TestLockOutlivesTheIdleTimeout(t *testing.T) {
	t.Parallel()
	dsn, plain := testenv.MySQL(t)
	ctx := context.Background()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["wait_timeout"] = "1" // OpenWith refuses it in a DSN: a plain pool
	db, err := sqlx.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	name := "paysvc.test." + testenv.Name(t)
	_, release, err := sqldb.Lock(ctx, db, name, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	// Past the idle timeout (the server closes an idle connection after
	// it, and frees its locks), the lock is still held.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		var free int
		if err := plain.Get(&free, "SELECT IS_FREE_LOCK(?)", name); err != nil {
			t.Fatal(err)
		}
		if free == 1 {
			t.Fatal("the lock was freed while held: its connection idled out")
		}
	}
	if _, _, err := sqldb.Lock(ctx, db, name, 0); !errors.Is(err, sqldb.ErrLocked) {
		t.Fatalf("a second Lock: %v, want ErrLocked", err)
	}
}

// Contenders for one named lock (replicas migrating at once) each get it
// within the wait, one at a time: on TiDB too, whose GET_LOCK under
// contention ends in "pessimistic lock retry limit reached" instead of
// waiting.
func TestLockUnderContention(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.SetMaxOpenConns(24)
	name := testenv.Name(t)
	var holders, most atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			_, release, err := sqldb.Lock(context.Background(), db, name, 30*time.Second)
			if err != nil {
				errs <- err
				return
			}
			n := holders.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(50 * time.Millisecond) // a migration's work, while the others wait
			holders.Add(-1)
			release()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Lock: %v", err)
	}
	if m := most.Load(); m != 1 {
		t.Fatalf("%d contenders held the lock at once, want 1", m)
	}
}

// The connection that held a named lock (its idle timeout raised for the
// run) never goes back to the pool: a payment on it would keep its row
// locks for a day if its client froze, not for the pool's idle timeout. A
// pool of one connection shows it, after a release and after ErrLocked.
func TestLockLeavesThePoolsIdleTimeout(t *testing.T) {
	t.Parallel()
	dsn, plain := testenv.MySQL(t)
	ctx := context.Background()
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var before int
	if err := db.Get(&before, "SELECT @@session.wait_timeout"); err != nil {
		t.Fatal(err)
	}
	name := "paysvc.test." + testenv.Name(t)
	_, release, err := sqldb.Lock(ctx, db, name, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	release()
	var after int
	if err := db.Get(&after, "SELECT @@session.wait_timeout"); err != nil || after != before {
		t.Fatalf("wait_timeout after a release: %d (%v), want the pool's %d", after, err, before)
	}

	holder, err := plain.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, "SELECT GET_LOCK(?, 0)", name); err != nil {
		t.Fatal(err)
	}
	if _, _, err := sqldb.Lock(ctx, db, name, 0); !errors.Is(err, sqldb.ErrLocked) {
		t.Fatalf("Lock while held elsewhere: %v, want ErrLocked", err)
	}
	if err := db.Get(&after, "SELECT @@session.wait_timeout"); err != nil || after != before {
		t.Fatalf("wait_timeout after ErrLocked: %d (%v), want the pool's %d", after, err, before)
	}
}

// A named lock's release returns within its bound when the server stops
// answering (here every byte to it black-holed): a daemon's shutdown after
// a reconcile run does not wait for the network's own timeouts.
func TestLockReleaseIsBounded(t *testing.T) {
	t.Parallel()
	dsn, _ := testenv.MySQL(t)
	proxy, proxied := testenv.MySQLProxy(t, dsn)
	db, err := sqlx.Open("mysql", proxied)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, release, err := sqldb.Lock(context.Background(), db, "paysvc.test."+testenv.Name(t), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	proxy.BlackholeWhen(func([]byte) bool { return true })
	done := make(chan struct{})
	start := time.Now()
	go func() { release(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("release still waiting after %s on a server that does not answer", time.Since(start).Round(time.Second))
	}
}
