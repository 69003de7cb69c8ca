// Package sqldb opens the MySQL pool and holds what every store needs: the one
// transaction helper, and the one place where driver errors get their meaning.
package sqldb

import (
	"context"
	"crypto/tls"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
)

// ErrCommitUnknown wraps an error returned by COMMIT: the transaction may or
// may not have been applied. Never ack on it; re-read or let redelivery find
// the outcome.
var ErrCommitUnknown = errors.New("commit outcome unknown")

// Open connects to MySQL and checks the connection. It forces the DSN options
// the stores rely on: parseTime, and a bounded dial timeout.
func Open(ctx context.Context, dsn string, maxOpen int) (*sqlx.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	cfg.ParseTime = true
	// The payment runs its four statements in one round trip (order.Store).
	// Every query here is a constant with escaped parameters.
	cfg.MultiStatements = true
	if !strings.Contains(dsn, "interpolateParams=false") {
		// One round trip per statement instead of prepare, execute and
		// close; safe with utf8mb4 (the driver refuses unsafe charsets).
		cfg.InterpolateParams = true
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	if _, ok := cfg.Params["time_zone"]; !ok {
		// DATETIME columns hold UTC, written by Go and by CURRENT_TIMESTAMP alike.
		cfg.Params["time_zone"] = "'+00:00'"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	db := sqlx.NewDb(sql.OpenDB(connector), "mysql")
	db.SetMaxOpenConns(maxOpen)
	db.SetMaxIdleConns(maxOpen)
	db.SetConnMaxLifetime(30 * time.Minute)
	db.SetConnMaxIdleTime(5 * time.Minute)
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql %s: %w", cfg.Addr, err)
	}
	return db, nil
}

// InTx runs fn in one transaction. fn's error rolls everything back and is
// returned as is. An error from COMMIT is wrapped in ErrCommitUnknown; it is
// never lost.
func InTx(ctx context.Context, db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		// After a lock wait timeout (1205) MySQL has rolled back only the
		// statement: this rolls back the whole transaction.
		if rbErr := tx.Rollback(); rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) {
			return errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%w: %w", ErrCommitUnknown, err)
	}
	return nil
}

// MySQL server error numbers that carry meaning here.
const (
	errDupEntry       = 1062
	errLockWait       = 1205
	errDeadlock       = 1213
	errServerShutdown = 1053
	errQueryKilled    = 1317
	errConnKilled     = 1927 // MariaDB: ER_CONNECTION_KILLED
	errReadOnly       = 1290 // --read-only: a failed-over primary
	errReadOnlyTx     = 1792
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

// IsDeadlock reports a deadlock (1213) or a lock wait timeout (1205): the
// transaction can be retried as a whole.
func IsDeadlock(err error) bool {
	c := code(err)
	return c == errDeadlock || c == errLockWait
}

// IsConnection reports a lost or refused connection, a killed connection or
// query, or a server that is shutting down or read-only: the server, not the
// data, is the problem.
func IsConnection(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		// Our own deadline, not the server's fault: context.DeadlineExceeded
		// would otherwise pass for a net.Error below.
		return false
	}
	switch code(err) {
	case errServerShutdown, errQueryKilled, errConnKilled, errReadOnly, errReadOnlyTx:
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

// Transient reports an error worth retrying the whole transaction in place.
// A commit whose outcome is unknown is not transient: it must be re-read.
func Transient(err error) bool {
	if errors.Is(err, ErrCommitUnknown) {
		return false
	}
	return IsDeadlock(err) || IsConnection(err)
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
