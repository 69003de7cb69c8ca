package sqldb_test

import (
	"context"
	"errors"
	"fmt"
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

func TestCheckDSN(t *testing.T) {
	for _, tc := range []struct {
		dsn  string
		want []string // substrings of the error; none: accepted
	}{
		{"root@tcp(127.0.0.1:3306)/paysvc", nil},
		{"u:p?a/ss@tcp(db:3306)/paysvc?parseTime=true&interpolateParams=true&multiStatements=true&loc=UTC", nil},
		{"u:p@tcp(db:3306)/paysvc?time_zone=%27%2B00%3A00%27&sql_mode=STRICT_ALL_TABLES", nil},
		{"root@tcp(127.0.0.1:3306)/paysvc?interpolateParams=false", []string{"interpolateParams=false", "driver.ErrSkip"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?multiStatements=false", []string{"multiStatements=false"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?parseTime=false", []string{"parseTime=false"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?clientFoundRows=true", []string{"clientFoundRows=true"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?loc=Local", []string{"loc=Local"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?time_zone=%27%2B08%3A00%27", []string{"time_zone='+08:00'"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?autocommit=0", []string{"autocommit=0"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?innodb_lock_wait_timeout=50", []string{"innodb_lock_wait_timeout", "mysql.lockWaitTimeout"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?tx_isolation=%27REPEATABLE-READ%27", []string{"tx_isolation"}},
		{"root@tcp(127.0.0.1:4000)/paysvc?tidb_txn_mode=optimistic", []string{"tidb_txn_mode", "pessimistic"}},
		{"root@tcp(127.0.0.1:4000)/paysvc?tidb_idle_transaction_timeout=60", []string{"tidb_idle_transaction_timeout", "mysql.idleTransactionTimeout"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?sql_mode=%27NO_ENGINE_SUBSTITUTION%27", []string{"not strict"}},
		{"root@tcp(127.0.0.1:3306)/paysvc?interpolateParams=false&parseTime=false", []string{"interpolateParams", "parseTime"}},
	} {
		err := sqldb.CheckDSN(tc.dsn)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("CheckDSN(%q) = %v, want nil", tc.dsn, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("CheckDSN(%q) = nil, want an error naming %q", tc.dsn, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("CheckDSN(%q) = %v, want it to name %q", tc.dsn, err, w)
			}
		}
	}
}

// A DSN that turns off what the payment needs never opens a pool.
func TestOpenRefusesInterpolateParamsFalse(t *testing.T) {
	dsn, _ := testenv.MySQL(t)
	db, err := sqldb.Open(context.Background(), dsn+"?interpolateParams=false", 1)
	var se *sqldb.SettingsError
	if err == nil {
		db.Close()
	}
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "interpolateParams") {
		t.Fatalf("Open = %v, want a SettingsError naming interpolateParams", err)
	}
}

// Every connection runs READ COMMITTED with paysvc's lock wait and
// idle-transaction bounds, each set through the variable the server has
// (MariaDB's idle_transaction_timeout, TiDB's tidb_idle_transaction_timeout,
// MySQL's wait_timeout), and on TiDB in pessimistic transactions whatever
// the server's default (make test-tidb runs it with optimistic ones).
func TestSessionSettings(t *testing.T) {
	t.Parallel()
	dsn, _ := testenv.MySQL(t)
	db, err := sqldb.OpenWith(context.Background(), dsn, sqldb.Options{MaxOpen: 2, LockWait: 3 * time.Second, IdleTransaction: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version string
	if err := db.Get(&version, "SELECT @@version"); err != nil {
		t.Fatal(err)
	}
	isolation, idleVar, mode := "tx_isolation", "idle_transaction_timeout", "'pessimistic'"
	switch v := strings.ToLower(version); {
	case strings.Contains(v, "tidb"):
		idleVar, mode = "tidb_idle_transaction_timeout", "@@session.tidb_txn_mode"
	case !strings.Contains(v, "mariadb"):
		isolation, idleVar = "transaction_isolation", "wait_timeout"
	}
	var iso, txnMode string
	var lockWait, idle int
	if err := db.QueryRow("SELECT @@session."+isolation+", @@session.innodb_lock_wait_timeout, @@session."+idleVar+", "+mode).
		Scan(&iso, &lockWait, &idle, &txnMode); err != nil {
		t.Fatal(err)
	}
	if iso != "READ-COMMITTED" || lockWait != 3 || idle != 7 || txnMode != "pessimistic" {
		t.Fatalf("%s session: isolation %s, lock wait %d, %s %d, transactions %s; want READ-COMMITTED, 3, 7, pessimistic",
			version, iso, lockWait, idleVar, idle, txnMode)
	}
}

// What paysvc relies on and the server does not do is logged when the
// pool opens: nothing on MariaDB and MySQL; on TiDB, its SKIP LOCKED that
// locks nothing, and CHECK constraints while tidb_enable_check_constraint
// is OFF.
func TestOpenSaysWhatTheServerDoesNotEnforce(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	var version string
	if err := db.Get(&version, "SELECT @@version"); err != nil {
		t.Fatal(err)
	}
	var want []string
	if strings.Contains(strings.ToLower(version), "tidb") {
		var checks string
		if err := db.Get(&checks, "SELECT @@global.tidb_enable_check_constraint"); err != nil {
			t.Fatal(err)
		}
		if checks != "1" {
			want = append(want, "CHECK constraints")
		}
		want = append(want, "SKIP LOCKED")
	}
	core, logs := observer.New(zap.WarnLevel)
	pool, err := sqldb.OpenWith(context.Background(), dsn, sqldb.Options{MaxOpen: 1, Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	var got []string
	for _, e := range logs.FilterMessage("mysql: not enforced on this server").All() {
		got = append(got, e.ContextMap()["what"].(string))
	}
	if len(got) != len(want) {
		t.Fatalf("%s: logged as not enforced %q, want %d naming %q", version, got, len(want), want)
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Fatalf("%s: logged as not enforced %q, want %q", version, got, want)
		}
	}
}

// processlistHas reports whether a statement containing marker runs.
func processlistHas(t *testing.T, db *sqlx.DB, marker string) bool {
	t.Helper()
	var n int
	if err := db.Get(&n, "SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE ? AND id <> CONNECTION_ID()",
		"%"+marker+"%"); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// processlist describes the server threads running a statement with marker.
func processlist(t *testing.T, db *sqlx.DB, marker string) string {
	var rows []struct {
		ID      int64   `db:"id"`
		Command string  `db:"command"`
		State   *string `db:"state"`
		Time    float64 `db:"time"`
	}
	if err := db.Select(&rows, "SELECT id, command, state, time FROM information_schema.processlist WHERE info LIKE ?", "%"+marker+"%"); err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%+v", rows)
}

// A statement whose context ends is killed on the server at once, instead
// of waiting out its lock (here 30 s) while the driver has hung up, and its
// transaction rolls back and lets go of its locks.
func TestCancelledStatementIsKilledOnTheServer(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 10.00), (2, 10.00)")
	holder := db.MustBegin()
	defer holder.Rollback()
	holder.MustExec("SELECT balance FROM t_account WHERE user_id = 1 FOR UPDATE")

	pool, err := sqldb.OpenWith(context.Background(), dsn, sqldb.Options{MaxOpen: 2, LockWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = sqldb.InTx(ctx, pool, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(ctx, "UPDATE t_account SET balance = 0.00 WHERE user_id = 2"); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "UPDATE t_account SET balance = balance - 1 /* kill-me */ WHERE user_id = 1")
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("transaction = %v, want the context's deadline", err)
	}
	for deadline := time.Now().Add(10 * time.Second); processlistHas(t, db, "kill-me"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10s the cancelled statement still runs on the server: %s", processlist(t, db, "kill-me"))
		}
	}
	// The transaction rolled back and let go of its locks: the row it
	// changed before it waited can be locked at once and is unchanged.
	tx := db.MustBegin()
	defer tx.Rollback()
	tx.MustExec("SET SESSION innodb_lock_wait_timeout = 1")
	var bal string
	if err := tx.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 2 FOR UPDATE"); err != nil || bal != "10.00" {
		t.Fatalf("row of the killed transaction: %q %v, want 10.00, free", bal, err)
	}
}

// A transaction left open by a client whose network went dark (here its
// COMMIT is black-holed and the server's socket stays open) is ended by
// the server after the idle-transaction bound, and its row locks with it.
func TestIdleTransactionOfABlackholedClientEnds(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 10.00)")
	proxy, proxied := testenv.MySQLProxy(t, dsn)
	proxy.BlackholeWhen(testenv.IsCommitOrKill) // only the server may end it
	pool, err := sqldb.OpenWith(context.Background(), proxied, sqldb.Options{MaxOpen: 2, IdleTransaction: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = sqldb.InTx(ctx, pool, func(tx *sqldb.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE t_account SET balance = 5.00 WHERE user_id = 1")
		return err
	})
	if !errors.Is(err, sqldb.ErrCommitUnknown) {
		t.Fatalf("InTx = %v, want commit unknown", err)
	}
	start := time.Now()
	testenv.Eventually(t, 10*time.Second, func() bool {
		tx := db.MustBegin()
		defer tx.Rollback()
		tx.MustExec("SET SESSION innodb_lock_wait_timeout = 1")
		var bal string
		return tx.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1 FOR UPDATE") == nil && bal == "10.00"
	}, "the black-holed transaction still holds the row (or was committed)")
	t.Logf("row lock free %s after the client gave up", time.Since(start).Round(100*time.Millisecond))
}

// With binary logging in STATEMENT format, READ COMMITTED writes fail and
// the outbox's LIMIT ... SKIP LOCKED leases replicate wrongly: Open refuses,
// saying what to set.
func TestOpenRefusesStatementBinlog(t *testing.T) {
	t.Parallel()
	addr := testenv.MariaDB(t, "--log-bin=binlog", "--binlog-format=STATEMENT", "--server-id=1")
	_, err := sqldb.Open(context.Background(), "root@tcp("+addr+")/", 1)
	var se *sqldb.SettingsError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), "binlog_format=ROW") {
		t.Fatalf("Open = %v, want a SettingsError asking for binlog_format=ROW", err)
	}
	// ROW is fine: the check is about the format, not about binary logging.
	db, err := sqldb.Open(context.Background(), "root@tcp("+addr+")/?binlog_format=ROW", 1)
	if err != nil {
		t.Fatalf("Open with binlog_format=ROW: %v", err)
	}
	db.Close()
}

// endedCtx has ended (Err) but its Done channel is not closed yet: the
// moment inside a cancel when the driver may already have returned the
// context's error and the AfterFunc that kills has not been started.
type endedCtx struct{ context.Context }

func (endedCtx) Err() error { return context.DeadlineExceeded }

// A statement disarms its kill when it returns. If its context has ended
// by then, the kill runs even though the context has not started it yet:
// stopping it there left the statement running on the server.
func TestDisarmAfterTheContextEndedStillKills(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	live, cancel := context.WithCancel(context.Background()) // Done open, never closed here
	defer cancel()
	id, err := sqldb.ArmAndDisarm(endedCtx{live}, connector)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		var n int
		return db.Get(&n, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", id) == nil && n == 0
	}, "the connection whose context ended before its kill started was not killed")
}

// A connection whose kill has started is never handed out again, even when
// the driver keeps it open (its statement returned as its context ended):
// the KILL would end the next caller's statement. The KILL is black-holed
// here, so only sqldb can keep the pool from handing the connection out.
func TestKilledConnectionIsNotReused(t *testing.T) {
	t.Parallel()
	dsn, _ := testenv.MySQL(t)
	proxy, proxied := testenv.MySQLProxy(t, dsn)
	proxy.BlackholeWhen(testenv.IsCommitOrKill)
	pool, err := sqldb.OpenWith(context.Background(), proxied, sqldb.Options{MaxOpen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	conn, err := pool.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var killed int64
	if err := conn.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&killed); err != nil {
		t.Fatal(err)
	}
	live, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := conn.ExecContext(endedCtx{live}, "DO 1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("statement = %v, want the context's deadline", err)
	}
	conn.Close()
	// A pinned connection: database/sql cannot quietly retry a bad one.
	next, err := pool.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	var id int64
	if err := next.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&id); err != nil || id == killed {
		t.Fatalf("the pool's next connection: thread %d, %v; want a fresh one, not thread %d under its kill", id, err, killed)
	}
}
