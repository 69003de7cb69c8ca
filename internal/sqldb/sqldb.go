// Package sqldb opens the MySQL pool and holds what every store needs: the one
// transaction helper, and the one place where driver errors get their meaning.
package sqldb

import (
	"cmp"
	"context"
	"crypto/tls"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
)

// ErrCommitUnknown wraps an error returned by COMMIT: the transaction may or
// may not have been applied. Never ack on it; re-read or let redelivery find
// the outcome.
var ErrCommitUnknown = errors.New("commit outcome unknown")

// Options are the pool size and the session settings of every connection.
type Options struct {
	MaxOpen int
	// LockWait bounds one wait for a row lock (innodb_lock_wait_timeout,
	// whole seconds, at least 1 s; 0: DefaultLockWait). A wait that long
	// ends in error 1205, which the caller retries as a whole later.
	LockWait time.Duration
	// IdleTransaction ends a connection whose transaction sits idle this long
	// (0: DefaultIdleTransaction): a client that vanished mid-transaction
	// (a black-holed network, a frozen process) cannot hold order and
	// account locks for hours. MariaDB's idle_transaction_timeout, TiDB's
	// tidb_idle_transaction_timeout; on MySQL, which has none, wait_timeout
	// (idle pooled connections are retired before it).
	IdleTransaction time.Duration
	// Log receives what the pool's background work cannot return: a
	// cancelled statement that could not be killed (nil: not logged).
	Log *zap.Logger

	killTimeout time.Duration // 0: killTimeout; tests shorten it
}

// Defaults for Options.
const (
	DefaultLockWait        = 5 * time.Second
	DefaultIdleTransaction = 30 * time.Second
)

// SettingsError is a server or DSN setting paysvc cannot run with:
// reconnecting cannot fix it, so start-up stops on it.
type SettingsError struct{ Err error }

func (e *SettingsError) Error() string { return e.Err.Error() }
func (e *SettingsError) Unwrap() error { return e.Err }

// Open connects with the default session settings (Options).
func Open(ctx context.Context, dsn string, maxOpen int) (*sqlx.DB, error) {
	return OpenWith(ctx, dsn, Options{MaxOpen: maxOpen})
}

// OpenWith connects to MySQL and checks the connection. It refuses a DSN
// that changes what the stores rely on (CheckDSN) and a server that logs
// statements for replication (binlog_format=STATEMENT) or is not strict,
// both with a *SettingsError. Every connection runs READ COMMITTED (no gap
// locks: a payment for an order not yet created cannot block its insert),
// with opts' lock wait and idle-transaction bounds (on TiDB, pessimistic
// transactions too), and has its running statement killed on the server
// when the statement's context ends. Only the variables the server has are
// read and set: what paysvc relies on that the server does not do is
// logged to opts.Log as a warning.
func OpenWith(ctx context.Context, dsn string, opts Options) (*sqlx.DB, error) {
	if err := CheckDSN(dsn); err != nil {
		return nil, &SettingsError{fmt.Errorf("mysql dsn: %w", err)}
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, &SettingsError{fmt.Errorf("mysql dsn: %w", err)}
	}
	opts.LockWait = cmp.Or(opts.LockWait, DefaultLockWait)
	opts.IdleTransaction = cmp.Or(opts.IdleTransaction, DefaultIdleTransaction)
	cfg.ParseTime = true
	cfg.MultiStatements = true // a payment's writes are one multi-statement (order.Store)
	// One round trip per statement instead of prepare, execute and close;
	// safe with utf8mb4 (the driver refuses unsafe charsets). Every query is
	// a constant with escaped parameters.
	cfg.InterpolateParams = true
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	// DATETIME columns hold UTC, written by Go and by CURRENT_TIMESTAMP alike.
	cfg.Params["time_zone"] = "'+00:00'"
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	srv, err := inspect(pingCtx, cfg)
	if err != nil {
		return nil, err
	}
	cfg.Params["innodb_lock_wait_timeout"] = strconv.Itoa(max(1, int(opts.LockWait.Round(time.Second)/time.Second)))
	cfg.Params[srv.isolation] = "'READ-COMMITTED'"
	cfg.Params[srv.idleVar] = strconv.Itoa(max(1, int(opts.IdleTransaction.Round(time.Second)/time.Second)))
	if srv.tidb {
		// READ COMMITTED, and locks taken when the statement runs: an
		// optimistic transaction would meet a conflict only at COMMIT
		// (error 9007), which paysvc takes for an unknown outcome.
		cfg.Params["tidb_txn_mode"] = "'pessimistic'"
	}
	log := cmp.Or(opts.Log, zap.NewNop())
	for _, gap := range srv.gaps {
		log.Warn("mysql: not enforced on this server", zap.String("server", srv.version), zap.String("what", gap))
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, &SettingsError{fmt.Errorf("mysql dsn: %w", err)}
	}
	db := sqlx.NewDb(sql.OpenDB(killingConnector{Connector: connector,
		log: log, timeout: cmp.Or(opts.killTimeout, killTimeout)}), "mysql")
	db.SetMaxOpenConns(opts.MaxOpen)
	db.SetMaxIdleConns(opts.MaxOpen)
	db.SetConnMaxLifetime(30 * time.Minute)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if srv.idleVar == "wait_timeout" {
		db.SetConnMaxIdleTime(min(5*time.Minute, opts.IdleTransaction/2))
	}
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
	}
	return db, nil
}

// server is what OpenWith learns from the server before it opens the pool.
type server struct {
	version string
	tidb    bool
	// isolation is the session variable of the isolation level:
	// tx_isolation (MariaDB, TiDB) or transaction_isolation (MySQL 8).
	isolation string
	// idleVar bounds an idle transaction: idle_transaction_timeout
	// (MariaDB), tidb_idle_transaction_timeout (TiDB), or wait_timeout
	// (MySQL, which has no such bound: an idle connection's, in or out of
	// a transaction).
	idleVar string
	// gaps are what paysvc relies on that this server does not do, for
	// the log.
	gaps []string
}

// settingVars are the session variables inspect reads when the server has
// them: SELECT @@name fails on a server without name (TiDB has no
// log_bin), so they are read by name from SHOW VARIABLES.
var settingVars = []string{"log_bin", "binlog_format", "tx_isolation", "transaction_isolation",
	"idle_transaction_timeout", "tidb_idle_transaction_timeout", "tidb_enable_check_constraint"}

// inspect connects once and reads the server's flavor, the session
// variables it has, and the settings paysvc cannot run with.
func inspect(ctx context.Context, cfg *mysql.Config) (server, error) {
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return server{}, &SettingsError{fmt.Errorf("mysql dsn: %w", err)}
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	var version, mode string
	if err := db.QueryRowContext(ctx, "SELECT @@version, @@session.sql_mode").Scan(&version, &mode); err != nil {
		return server{}, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
	}
	vars := map[string]string{}
	rows, err := db.QueryContext(ctx, "SHOW SESSION VARIABLES WHERE Variable_name IN ('"+strings.Join(settingVars, "', '")+"')")
	if err != nil {
		return server{}, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return server{}, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
		}
		vars[strings.ToLower(name)] = value
	}
	if err := rows.Err(); err != nil {
		return server{}, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
	}
	on := func(name string) bool { v := vars[name]; return strings.EqualFold(v, "ON") || v == "1" }
	if on("log_bin") && strings.EqualFold(vars["binlog_format"], "STATEMENT") {
		return server{}, &SettingsError{fmt.Errorf("mysql %s: binary logging with binlog_format=STATEMENT: "+
			"paysvc runs its payments under READ COMMITTED, which InnoDB refuses to log as statements, and the "+
			"outbox's ORDER BY ... LIMIT ... SKIP LOCKED leases are unsafe for statement replication; set binlog_format=ROW (or MIXED)", cfg.Addr)}
	}
	if !strictMode(mode) {
		return server{}, &SettingsError{fmt.Errorf("mysql %s: sql_mode %q is not strict: an oversized or out-of-range "+
			"value would be cut silently; add STRICT_TRANS_TABLES to the server's sql_mode or to the DSN (sql_mode=...)", cfg.Addr, mode)}
	}
	srv := server{version: version, tidb: isTiDB(version)}
	switch {
	case vars["tx_isolation"] != "":
		srv.isolation = "tx_isolation"
	case vars["transaction_isolation"] != "":
		srv.isolation = "transaction_isolation"
	default:
		return server{}, &SettingsError{fmt.Errorf("mysql %s (%s): neither tx_isolation nor transaction_isolation: "+
			"paysvc cannot set READ COMMITTED", cfg.Addr, version)}
	}
	switch {
	case vars["idle_transaction_timeout"] != "":
		srv.idleVar = "idle_transaction_timeout"
	case vars["tidb_idle_transaction_timeout"] != "":
		srv.idleVar = "tidb_idle_transaction_timeout"
	default:
		srv.idleVar = "wait_timeout"
	}
	if srv.tidb {
		if !on("tidb_enable_check_constraint") {
			srv.gaps = append(srv.gaps, "CHECK constraints (tidb_enable_check_constraint is OFF: a table created "+
				"meanwhile has none; set it ON globally before paysvc migrate)")
		}
		srv.gaps = append(srv.gaps, "SELECT ... FOR UPDATE SKIP LOCKED (it locks nothing and skips nothing): "+
			"outbox replicas take turns to lease notices (FOR UPDATE), and an account row locked elsewhere "+
			"is found only by a payment that waited it out")
	}
	return srv, nil
}

func isTiDB(version string) bool { return strings.Contains(strings.ToLower(version), "tidb") }

// SkipLockedLocks reports whether the server honours SELECT ... FOR UPDATE
// SKIP LOCKED: it locks the rows it returns and leaves out those locked
// elsewhere. TiDB accepts the clause, then locks nothing and skips nothing
// (its planner takes only FOR UPDATE, NOWAIT and WAIT n as locking reads,
// and reads the rows as a plain SELECT): there a read that needs the
// locks says FOR UPDATE and waits for them.
func SkipLockedLocks(ctx context.Context, q sqlx.QueryerContext) (bool, error) {
	var version string
	if err := sqlx.GetContext(ctx, q, &version, "SELECT @@version"); err != nil {
		return false, err
	}
	return !isTiDB(version), nil
}

// Tx is a connection inside a transaction of InTx.
type Tx = sqlx.Conn

// rollbackTimeout bounds a ROLLBACK sent after the caller's context ended.
const rollbackTimeout = 5 * time.Second

// InTx runs fn in one transaction on a connection of its own. fn's error
// rolls everything back and is returned as is. An error from COMMIT is
// wrapped in ErrCommitUnknown; it is never lost.
//
// Every statement, COMMIT and ROLLBACK included, runs under a context:
// database/sql's Tx.Commit and Tx.Rollback take none, and on a black-holed
// connection they would wait forever. A connection whose transaction state
// is unknown (a failed COMMIT or ROLLBACK) is discarded, never pooled.
func InTx(ctx context.Context, db *sqlx.DB, fn func(tx *Tx) error) error {
	conn, err := db.Connx(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer conn.Close()
	discard := func() { conn.Raw(func(any) error { return driver.ErrBadConn }) }
	if _, err := conn.ExecContext(ctx, "START TRANSACTION"); err != nil {
		discard()
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(conn); err != nil {
		// After a lock wait timeout (1205) MySQL has rolled back only the
		// statement: this rolls back the whole transaction.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if _, rbErr := conn.ExecContext(rctx, "ROLLBACK"); rbErr != nil {
			discard()
			if !IsConnection(err) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				return errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
			}
		}
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		discard()
		return fmt.Errorf("%w: %w", ErrCommitUnknown, err)
	}
	return nil
}

// MySQL server error numbers that carry meaning here.
const (
	errDupEntry       = 1062
	errNoGrant        = 1142 // a table the user has no grant on
	errSyntax         = 1064
	errLockWait       = 1205
	errUnknown        = 1105 // TiDB's error for whatever has no MySQL number
	errDeadlock       = 1213
	errServerShutdown = 1053
	errQueryKilled    = 1317
	errConnKilled     = 1927 // MariaDB: ER_CONNECTION_KILLED
	errReadOnly       = 1290 // --read-only: a failed-over primary
	errReadOnlyTx     = 1792
	// A server refusing a new connection: a pool dials now and then (a
	// connection's lifetime ends, one was discarded), and that dial can
	// meet these while pooled connections still answer.
	errTooManyConns     = 1040
	errHostBlocked      = 1129
	errTooManyUserConns = 1203
	errUserLimit        = 1226 // a user's own MAX_USER_CONNECTIONS (or queries, updates) per hour
	errNodeNotReady     = 1047 // Galera: WSREP has not yet prepared the node (IsNodeNotReady)
	errOfflineMode      = 3032 // MySQL: offline_mode
	errIdleDisconnect   = 4031 // MySQL 8.0.24+: disconnected after inactivity
)

func code(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// IsDuplicateKey reports a unique-index violation (1062).
func IsDuplicateKey(err error) bool { return code(err) == errDupEntry }

// DuplicateKey is the name of the unique index a 1062 names ("" for any
// other error): the end of "Duplicate entry '...' for key 'name'" (MySQL 8
// writes 'table.name'). Read from the end: the entry before it is data,
// and may itself hold an index's name.
func DuplicateKey(err error) string {
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != errDupEntry {
		return ""
	}
	const marker = " for key '"
	i := strings.LastIndex(me.Message, marker)
	if i < 0 || !strings.HasSuffix(me.Message, "'") {
		return ""
	}
	name := me.Message[i+len(marker) : len(me.Message)-1]
	if dot := strings.LastIndexByte(name, '.'); dot >= 0 {
		name = name[dot+1:]
	}
	return name
}

// IsSyntax reports a statement the server cannot parse (1064): an older
// server without the syntax paysvc asks for (SKIP LOCKED before MariaDB
// 10.6 and MySQL 8.0).
func IsSyntax(err error) bool { return code(err) == errSyntax }

// IsNoGrant reports a table the user has no grant on (or, having none,
// cannot be told is missing).
func IsNoGrant(err error) bool { return code(err) == errNoGrant }

// IsDeadlock reports a deadlock (1213): InnoDB rolled the transaction back
// at once, and running it again as a whole usually succeeds.
func IsDeadlock(err error) bool { return code(err) == errDeadlock }

// IsLockWait reports a lock wait timeout (1205): a row stayed locked for the
// whole innodb_lock_wait_timeout. MySQL rolled back only the statement: roll
// back the transaction, and try again later rather than at once. TiDB
// answers some of its lock wait timeouts (a write conflict found after the
// wait, in pessimistic transactions) with its storage layer's bare error:
// 1105 "lock wait timeout".
func IsLockWait(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == errLockWait || me.Number == errUnknown && me.Message == "lock wait timeout")
}

// IsConnection reports a lost or refused connection (refused by the
// network or by the server: too many connections, a blocked host, offline
// mode), a killed connection or query, a server that is shutting down or
// read-only, or a Galera node that is not ready (IsNodeNotReady): the
// server, not the data, is the problem.
func IsConnection(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		// Our own deadline, not the server's fault: context.DeadlineExceeded
		// would otherwise pass for a net.Error below.
		return false
	}
	switch code(err) {
	case errServerShutdown, errQueryKilled, errConnKilled, errReadOnly, errReadOnlyTx,
		errTooManyConns, errHostBlocked, errTooManyUserConns, errUserLimit, errNodeNotReady, errOfflineMode, errIdleDisconnect:
		return true
	}
	if errors.Is(err, ErrNodeNotReady) {
		return true
	}
	var netErr net.Error
	return errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &netErr)
}

// IsSchemaOrPermission reports a missing table or column, or a refused
// grant: the schema or the account is wrong, not the data.
func IsSchemaOrPermission(err error) bool {
	switch code(err) {
	case 1044, 1045, 1142, 1143, 1146, 1054:
		return true
	}
	return false
}

// IsDataRejected reports a server error about the values written (too
// long, not valid in the character set, out of range, NULL where none may
// be, against a CHECK constraint or a foreign key): writing the same
// values again fails again, while other values would go through. Only
// these codes: any other (a full disk, too many connections, a statement
// timeout) is the server's state, and the same write may go through later.
func IsDataRejected(err error) bool {
	switch code(err) {
	case 1048, // a NULL in a NOT NULL column
		1263, 1264, 1265, 1690, // out of range, truncated
		1292, 1300, 1366, 1367, 1411, // a value not valid for its column or character set
		1406,       // too long
		1451, 1452, // a foreign key
		3140,       // not valid JSON (MySQL)
		3819, 4025: // a CHECK constraint (MySQL, MariaDB)
		return true
	}
	return false
}

// Transient reports an error worth retrying the whole transaction in place
// at once: a deadlock or a lost connection. A lock wait timeout is not (it
// has already waited long), nor is a commit whose outcome is unknown (it
// must be re-read).
func Transient(err error) bool {
	if errors.Is(err, ErrCommitUnknown) {
		return false
	}
	return IsDeadlock(err) || IsConnection(err)
}

// ErrLocked: another connection held the named lock for the whole wait.
var ErrLocked = errors.New("the named lock is held elsewhere")

// lockIdleTimeout is the idle timeout of a connection that holds a named
// lock: longer than any run that holds one.
const lockIdleTimeout = 24 * time.Hour

// lockRetryPause is the pause before GET_LOCK is asked again after TiDB's
// "pessimistic lock retry limit reached".
const lockRetryPause = 100 * time.Millisecond

// lockRetryLimit reports TiDB's error for a statement whose lock it
// retried too often (its pessimistic-txn.max-retry-count, 256).
func lockRetryLimit(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errUnknown && me.Message == "pessimistic lock retry limit reached"
}

// lockReleaseTimeout bounds a named lock's release.
const lockReleaseTimeout = 5 * time.Second

// Lock takes the named lock name (GET_LOCK) on a connection of its own,
// waiting up to wait (ErrLocked after it), and returns that connection and
// the lock's release, which also returns the connection. The connection's
// idle timeout is raised first: on MySQL, OpenWith bounds every
// connection's idle time (wait_timeout), and a holder that works on other
// connections meanwhile would lose the connection, and with it the lock,
// without a word. The connection is closed afterwards, not pooled: its
// raised idle timeout would outlive the lock, and on MySQL the idle timeout
// is what bounds a frozen client's open transaction.
//
// GET_LOCK is known only to the server that grants it: on a Galera or
// Percona XtraDB Cluster, a process on another node is granted the same
// name. Jobs that must run once across replicas take a Lease instead;
// Lock serves the migrations, which run before t_lease exists (see
// Migrate).
func Lock(ctx context.Context, db *sqlx.DB, name string, wait time.Duration) (*sqlx.Conn, func(), error) {
	conn, err := db.Connx(ctx)
	if err != nil {
		return nil, nil, err
	}
	discard := func() {
		conn.Raw(func(any) error { return driver.ErrBadConn }) // closed by database/sql, never pooled
		conn.Close()
	}
	var got int
	_, err = conn.ExecContext(ctx, "SET SESSION wait_timeout = ?", int(lockIdleTimeout/time.Second))
	// TiDB's GET_LOCK is a row lock of its own, and under contention ends
	// in its error "pessimistic lock retry limit reached" (1105) instead of
	// waiting: asked again until the wait has passed.
	for deadline := time.Now().Add(wait); err == nil; {
		err = conn.GetContext(ctx, &got, "SELECT COALESCE(GET_LOCK(?, ?), 0)", name, max(0, int(time.Until(deadline)/time.Second)))
		if !lockRetryLimit(err) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(lockRetryPause):
			err = nil
		}
	}
	if err == nil && got != 1 {
		err = ErrLocked
	}
	if err != nil {
		discard()
		return nil, nil, err
	}
	return conn, func() {
		// Bounded: a server that stopped answering would hold the caller
		// (a daemon's shutdown) for the network's own timeouts. Closing
		// the connection, next, frees the lock on the server anyway.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lockReleaseTimeout)
		defer cancel()
		conn.ExecContext(rctx, "SELECT RELEASE_LOCK(?)", name)
		discard()
	}, nil
}

// DB is the pool type the stores use.
type DB = sqlx.DB

// CreateDatabase creates the DSN's database if it does not exist.
func CreateDatabase(ctx context.Context, dsn string) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("mysql dsn: %w", err)
	}
	name := cfg.DBName
	if name == "" {
		return errors.New("mysql dsn: no database name")
	}
	cfg.DBName = ""
	db, err := Open(ctx, cfg.FormatDSN(), 1)
	if err != nil {
		return err
	}
	defer db.Close()
	var n int
	if err := db.GetContext(ctx, &n, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", name); err != nil {
		return fmt.Errorf("look up database %s: %w", name, err)
	}
	if n > 0 {
		return nil
	}
	quoted := "`" + strings.ReplaceAll(name, "`", "``") + "`"
	if _, err := db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS "+quoted+" DEFAULT CHARACTER SET utf8mb4"); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// WithCA registers a TLS configuration trusting caFile with the MySQL driver
// and returns dsn using it (tls=paysvc-ca). An empty caFile returns dsn as is
// (the DSN's own tls= option, if any, applies).
func WithCA(dsn, caFile string, tlsCfg *tls.Config) (string, error) {
	if caFile == "" {
		return dsn, nil
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("mysql dsn: %w", err)
	}
	if err := mysql.RegisterTLSConfig("paysvc-ca", tlsCfg); err != nil {
		return "", err
	}
	cfg.TLSConfig = "paysvc-ca"
	return cfg.FormatDSN(), nil
}
