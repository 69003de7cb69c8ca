package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

// run parses args and runs one command of the table (cli.go). env is the
// process environment (KEY=VALUE); output and logs go to out, and so does
// the usage that help, -h or --help ask for. A usage error is an *exitError
// with code 64 that carries the usage for main to print on stderr.
func run(ctx context.Context, args, env []string, out io.Writer) error {
	c, err := parseCommand(args)
	if err != nil {
		return err
	}
	if c.help != "" {
		_, err := io.WriteString(out, c.help)
		return err
	}
	c.env, c.out = map[string]string{}, out
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			c.env[k] = v
		}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return c.run(ctx, c)
}

// openMySQL waits for MySQL with capped backoff (a database that is still
// starting is no reason to crash-loop), then checks the schema: a missing
// migration or unique index stops start-up. A table the user may not read
// is waited for like the server: its grant comes after the migration that
// makes the table (scripts/least-privilege.sh mysql, run again). Stopped
// (ctx done) while it waits, it returns an error wrapping ctx.Err().
func openMySQL(ctx context.Context, cfg *Config, log *zap.Logger) (*sqldb.DB, error) {
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err != nil {
		return nil, err
	}
	wait := 200 * time.Millisecond
	dsn, err := cfg.mysqlDSN()
	if err != nil {
		return nil, err
	}
	opts := sqldb.Options{MaxOpen: cfg.MySQL.MaxOpenConns,
		LockWait: cfg.MySQL.LockWaitTimeout, IdleTransaction: cfg.MySQL.IdleTransactionTimeout, Log: log}
	for {
		db, err := sqldb.OpenWith(ctx, dsn, opts)
		var settings *sqldb.SettingsError
		if errors.As(err, &settings) {
			return nil, err // waiting cannot fix it
		}
		if err == nil {
			if err = sqldb.CheckSchema(ctx, db, ms); err == nil {
				return db, nil
			}
			db.Close()
			switch {
			case sqldb.IsNoGrant(err):
				log.Warn("mysql: a grant is missing; waiting", zap.Error(err), zap.Duration("backoff", wait))
			case sqldb.IsConnection(err):
				// The server went away between the ping and the check (a
				// Galera node that left the primary component answers
				// 1047): wait, as for a server that does not answer.
				log.Warn("mysql unavailable; waiting", zap.Error(err), zap.Duration("backoff", wait))
			default:
				return nil, err
			}
		} else {
			log.Warn("mysql unavailable; waiting", zap.Error(err), zap.Duration("backoff", wait))
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stopped while waiting for mysql: %w", ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 15*time.Second)
	}
}
