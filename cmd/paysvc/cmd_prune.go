package main

import (
	"context"
	"errors"
	"flag"
	"time"

	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/prune"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/migrations"
)

// pruneCommands: retention of the tables that only grow.
var pruneCommands = []*cmdSpec{{
	name:     "prune",
	synopsis: "[--dry-run]",
	summary:  "delete sent notices, payment events, expired sessions and resolved dead letters past their prune.* windows",
	details: `Deletes, in batches of prune.batch rows (each a short transaction locking
only the rows it deletes, prune.pause apart): notices in t_outbox sent
before prune.outboxAfter, events in t_payment_event written before
prune.eventsAfter, sessions in t_admin_session expired before
prune.sessionsAfter, and dead letters REPLAYED or DISCARDED, unchanged
since prune.deadLettersAfter, with their history. A notice not sent and a
NEW dead letter never go, nor any order, account or flow. A window of 0
keeps its table whole.

One run at a time, across replicas and CronJobs: a run that finds another
holding the lease paysvc.prune stops at once, exit status 1. Connects with
prune.dsn (else mysql.dsn). Logs go to stdout, as run's: a line per table
with its rows, batches, seconds and rows a second, then a total.

--dry-run counts what would go, deletes nothing and takes no lease.`,
	flags: pruneCmd,
}}

func pruneCmd(fs *flag.FlagSet) runFunc {
	dryRun := fs.Bool("dry-run", false, "count the rows that would go; delete nothing")
	return func(ctx context.Context, c *cmdLine) error {
		return c.daemon(ctx, func(ctx context.Context, cfg *Config, log *zap.Logger) error {
			db, err := openPrune(ctx, cfg, log)
			if err != nil {
				return err
			}
			defer db.Close()
			o := pruneOptions(cfg, log)
			o.DryRun = *dryRun
			start := time.Now()
			res, err := prune.Run(ctx, db, o)
			if errors.Is(err, prune.ErrRunning) {
				return err
			}
			var rows int64
			for _, r := range res {
				rows += r.Rows
			}
			log.Info("prune: done", zap.Bool("dry_run", *dryRun), zap.Int64("rows", rows),
				zap.Float64("seconds", time.Since(start).Seconds()), zap.Bool("failed", err != nil))
			return err
		})
	}
}

// pruneOptions are the prune.* windows and pace.
func pruneOptions(cfg *Config, log *zap.Logger) prune.Options {
	return prune.Options{OutboxAfter: cfg.Prune.OutboxAfter, EventsAfter: cfg.Prune.EventsAfter,
		SessionsAfter: cfg.Prune.SessionsAfter, DeadLettersAfter: cfg.Prune.DeadLettersAfter,
		Batch: cfg.Prune.Batch, Pause: cfg.Prune.Pause, Log: log}
}

// openPrune opens a small pool with prune.dsn (else mysql.dsn), with the
// daemon's lock-wait bound (a delete waiting on a row an operator holds
// gives up, and the next run takes the row), and checks that every
// migration is applied: the indexes pruning uses come with 0010.
func openPrune(ctx context.Context, cfg *Config, log *zap.Logger) (*sqldb.DB, error) {
	dsn, err := cfg.pruneDSN()
	if err != nil {
		return nil, err
	}
	// Two connections: the batches, and the lease's renewal.
	db, err := sqldb.OpenWith(ctx, dsn, sqldb.Options{MaxOpen: 2, LockWait: cfg.MySQL.LockWaitTimeout,
		IdleTransaction: cfg.MySQL.IdleTransactionTimeout, Log: log})
	if err != nil {
		return nil, err
	}
	ms, err := sqldb.LoadMigrations(migrations.FS)
	if err == nil {
		err = sqldb.CheckApplied(ctx, db, ms)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// scheduledPrune runs prune every prune.interval inside the daemon, on a
// pool of its own (prune.dsn), counting the rows in paysvc_pruned_rows_total.
// A replica that finds another's run under way skips its turn.
func scheduledPrune(ctx context.Context, cfg *Config, m *metrics.Metrics, log *zap.Logger) {
	log = log.With(zap.String("component", "prune"))
	for {
		if !broker.Sleep(ctx, cfg.Prune.Interval) {
			return
		}
		db, err := openPrune(ctx, cfg, log)
		if err != nil {
			if ctx.Err() == nil {
				log.Error("prune: cannot open the database", zap.Error(err))
			}
			continue
		}
		o := pruneOptions(cfg, log)
		o.OnPruned = func(table string, n int64) { m.PrunedRows.WithLabelValues(table).Add(float64(n)) }
		_, err = prune.Run(ctx, db, o)
		db.Close()
		switch {
		case errors.Is(err, prune.ErrRunning):
			log.Info("prune: another replica's run holds the lease; skipped", zap.String("lease", prune.LeaseName))
		case err != nil && ctx.Err() == nil:
			log.Error("prune failed", zap.Error(err))
		case err == nil:
			m.PruneLastRun.SetToCurrentTime()
		}
	}
}
