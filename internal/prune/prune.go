// Package prune deletes the rows of the tables that only grow once they are
// older than their retention window: sent payment notices (t_outbox),
// payment events (t_payment_event), expired admin sessions
// (t_admin_session) and resolved dead letters (t_dead_letter, REPLAYED or
// DISCARDED, with their history in t_dead_letter_event). The money rows
// (t_order, t_account, t_account_flow) are never read or locked, and never
// deleted.
//
// Rows go in small batches, each its own short transaction that locks only
// the rows it deletes, found by their primary key: t_outbox and
// t_payment_event are walked in primary-key order (ids grow with their
// insertion time, so the walk stops at the first batch younger than the
// window), the dead letters and sessions by the indexes of migration 0010.
// A notice not sent yet and a dead letter still NEW are never deleted,
// whatever their age. One run at a time holds the lease paysvc.prune.
package prune

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/sqldb"
)

// The tables pruned, as Result.Table and the metric's label name them.
const (
	Outbox      = "t_outbox"
	Events      = "t_payment_event"
	Sessions    = "t_admin_session"
	DeadLetters = "t_dead_letter"
)

// Tables lists the pruned tables in the order a run takes them.
var Tables = []string{Outbox, Events, Sessions, DeadLetters}

// LeaseName is the lease (sqldb.Lease) a run holds: two runs at once (a
// CronJob that overlaps itself, a CronJob and a daemon) would walk the
// same rows.
const LeaseName = "paysvc.prune"

// ErrRunning: another run holds the lease.
var ErrRunning = errors.New("prune: another run holds the lease " + LeaseName)

// Options are a run's windows and pace.
type Options struct {
	// A row goes once it is older than its table's window: a notice sent
	// before it, an event written before it, a session that expired before
	// it, a dead letter resolved (last changed) before it. 0: the table is
	// left whole.
	OutboxAfter, EventsAfter, SessionsAfter, DeadLettersAfter time.Duration
	// Batch is the rows one transaction deletes at most (0: DefaultBatch).
	Batch int
	// Pause is the wait between two batches, which leaves the server to
	// the payments (and its purge to catch up).
	Pause time.Duration
	// DryRun counts what would go and deletes nothing (and takes no
	// lease).
	DryRun bool
	// LeaseWait is how long to wait for another run's lease (0: not at
	// all, ErrRunning).
	LeaseWait time.Duration
	// OnPruned, when set, is told each batch's deleted rows (the metric).
	OnPruned func(table string, rows int64)
	// Log receives the per-table summary (nil: none).
	Log *zap.Logger
}

// DefaultBatch is Options.Batch's default.
const DefaultBatch = 1000

// Result is what a run did to one table.
type Result struct {
	Table string
	// Window is the table's window; 0: the table was left whole.
	Window time.Duration
	// Cutoff is the time rows older than which go (the server's clock,
	// UTC); zero when the table was left whole.
	Cutoff time.Time
	// Rows deleted, or that would go (DryRun).
	Rows int64
	// Batches is the number of batches that deleted (or would delete)
	// rows.
	Batches int
	Elapsed time.Duration
	Err     error
}

// Run prunes every table whose window is set, in Tables' order, under the
// lease (but a dry run). A table that fails (a lock wait past
// innodb_lock_wait_timeout, a missing grant) is reported in its Result and
// the run goes on with the next; the error returned joins them. It returns
// ErrRunning when another run holds the lease.
func Run(ctx context.Context, db *sqlx.DB, o Options) ([]Result, error) {
	if o.Batch <= 0 {
		o.Batch = DefaultBatch
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if !o.DryRun {
		held, release, err := sqldb.Lease(ctx, db, LeaseName, o.LeaseWait)
		if errors.Is(err, sqldb.ErrLocked) {
			return nil, ErrRunning
		}
		if err != nil {
			return nil, fmt.Errorf("prune: %w", err)
		}
		defer release()
		ctx = held
	}
	// The cutoffs are the server's time: the rows' times are its own.
	var now time.Time
	if err := db.GetContext(ctx, &now, "SELECT UTC_TIMESTAMP(3)"); err != nil {
		return nil, fmt.Errorf("prune: read the server's time: %w", err)
	}
	p := &pruner{db: db, o: o}
	var results []Result
	var errs []error
	for _, t := range Tables {
		r := Result{Table: t, Window: p.window(t)}
		if r.Window > 0 {
			r.Cutoff = now.Add(-r.Window)
			start := time.Now()
			if r.Err = context.Cause(ctx); r.Err == nil {
				r.Rows, r.Batches, r.Err = p.table(ctx, t, r.Cutoff)
			}
			r.Elapsed = time.Since(start)
			if r.Err == nil && ctx.Err() != nil {
				r.Err = context.Cause(ctx) // stopped, or the lease lost
			}
		}
		p.logResult(r)
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("prune %s: %w", t, r.Err))
		}
		results = append(results, r)
	}
	return results, errors.Join(errs...)
}

type pruner struct {
	db *sqlx.DB
	o  Options
}

func (p *pruner) window(table string) time.Duration {
	switch table {
	case Outbox:
		return p.o.OutboxAfter
	case Events:
		return p.o.EventsAfter
	case Sessions:
		return p.o.SessionsAfter
	default:
		return p.o.DeadLettersAfter
	}
}

func (p *pruner) logResult(r Result) {
	fields := []zap.Field{zap.String("table", r.Table), zap.Bool("dry_run", p.o.DryRun)}
	if r.Window == 0 {
		p.o.Log.Info("prune: table kept whole (its window is 0)", fields...)
		return
	}
	fields = append(fields, zap.String("window", r.Window.String()), zap.Time("cutoff", r.Cutoff),
		zap.Int64("rows", r.Rows), zap.Int("batches", r.Batches), zap.Float64("seconds", r.Elapsed.Seconds()))
	if r.Elapsed > 0 {
		fields = append(fields, zap.Float64("rows_per_second", float64(r.Rows)/r.Elapsed.Seconds()))
	}
	switch {
	case r.Err != nil:
		p.o.Log.Error("prune: table failed", append(fields, zap.Error(r.Err))...)
	case p.o.DryRun:
		p.o.Log.Info("prune: rows that would go", fields...)
	default:
		p.o.Log.Info("prune: table pruned", fields...)
	}
}

func (p *pruner) table(ctx context.Context, table string, cutoff time.Time) (int64, int, error) {
	switch table {
	case Outbox:
		// A notice goes once sent before the cutoff; a pending one never
		// does. It was written before it was sent: the walk ends at the
		// first batch written after the cutoff.
		return p.walk(ctx, Outbox, "status = 'SENT' AND sent_time < ?", "create_time < ?", cutoff)
	case Events:
		return p.walk(ctx, Events, "create_time < ?", "create_time < ?", cutoff)
	case Sessions:
		return p.byIndex(ctx, Sessions, "id", "expires_at < ?", "expires_at", cutoff)
	default:
		return p.deadLetters(ctx, cutoff)
	}
}

// walk deletes the rows of table for which gone holds (one ? each: the
// cutoff), walking the primary key in batches: each batch reads the next
// Batch ids (a plain, non-locking read of a primary-key range) and deletes
// those to go by id, gone checked again, in one autocommit statement that
// locks those rows alone. old holds for a row written before the cutoff:
// ids grow with that time, so the walk ends after the first batch whose
// last row is younger (a row younger than the cutoff that old misses is
// left for the next run).
func (p *pruner) walk(ctx context.Context, table, gone, old string, cutoff time.Time) (rows int64, batches int, err error) {
	var from uint64
	for {
		var scan []struct {
			ID   uint64 `db:"id"`
			Gone bool   `db:"gone"`
			Old  bool   `db:"old"`
		}
		q := fmt.Sprintf("SELECT id, (%s) AS gone, (%s) AS old FROM %s WHERE id > ? ORDER BY id LIMIT ?", gone, old, table)
		if err := p.db.SelectContext(ctx, &scan, q, cutoff, cutoff, from, p.o.Batch); err != nil {
			return rows, batches, err
		}
		var ids []uint64
		for _, r := range scan {
			if r.Gone {
				ids = append(ids, r.ID)
			}
		}
		if len(ids) > 0 {
			n, err := p.delete(ctx, table, "id", ids, gone, cutoff)
			rows += n
			batches++
			if err != nil {
				return rows, batches, err
			}
		}
		if len(scan) < p.o.Batch || !scan[len(scan)-1].Old {
			return rows, batches, nil
		}
		from = scan[len(scan)-1].ID
		if err := p.pause(ctx); err != nil {
			return rows, batches, err
		}
	}
}

// byIndex deletes the rows of table for which gone holds, found oldest
// first through the index on order (gone is a range of that index), by
// their primary key pk. A dry run counts them through the same index.
func (p *pruner) byIndex(ctx context.Context, table, pk, gone, order string, cutoff time.Time) (rows int64, batches int, err error) {
	if p.o.DryRun {
		err := p.db.GetContext(ctx, &rows, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE %s", table, gone), cutoff)
		return rows, int(ceilDiv(rows, int64(p.o.Batch))), err
	}
	for {
		var ids []string
		q := fmt.Sprintf("SELECT %s FROM %s WHERE %s ORDER BY %s, %s LIMIT ?", pk, table, gone, order, pk)
		if err := p.db.SelectContext(ctx, &ids, q, cutoff, p.o.Batch); err != nil {
			return rows, batches, err
		}
		if len(ids) == 0 {
			return rows, batches, nil
		}
		n, err := p.delete(ctx, table, pk, ids, gone, cutoff)
		rows += n
		batches++
		if err != nil || len(ids) < p.o.Batch || n == 0 {
			// n == 0: every row read changed before its delete; the
			// next run takes what is left.
			return rows, batches, err
		}
		if err := p.pause(ctx); err != nil {
			return rows, batches, err
		}
	}
}

// delete deletes the rows of table whose pk is in ids and for which gone
// still holds, in one autocommit statement, and counts them.
func (p *pruner) delete(ctx context.Context, table, pk string, ids any, gone string, cutoff time.Time) (int64, error) {
	if p.o.DryRun {
		return int64(length(ids)), nil
	}
	q, args, err := sqlx.In(fmt.Sprintf("DELETE FROM %s WHERE %s IN (?) AND %s", table, pk, gone), ids, cutoff)
	if err != nil {
		return 0, err
	}
	res, err := p.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if n > 0 && p.o.OnPruned != nil {
		p.o.OnPruned(table, n)
	}
	return n, err
}

// deadLetterGone: a dead letter goes once resolved (replayed or discarded)
// and left unchanged since the cutoff. A NEW one never goes.
const deadLetterGone = "status IN ('REPLAYED', 'DISCARDED') AND update_time < ?"

// deadLetters deletes the resolved dead letters last changed before
// cutoff, with their history, status by status through the index on
// (status, update_time). Each batch is one transaction: the rows are
// locked and checked again (a replay or a new parking in between makes a
// row NEW or changes its time: it stays), then their events and the rows
// go. A parking of the same message after its row is gone makes a new row.
func (p *pruner) deadLetters(ctx context.Context, cutoff time.Time) (rows int64, batches int, err error) {
	if p.o.DryRun {
		err := p.db.GetContext(ctx, &rows, "SELECT COUNT(*) FROM t_dead_letter WHERE "+deadLetterGone, cutoff)
		return rows, int(ceilDiv(rows, int64(p.o.Batch))), err
	}
	for _, status := range []string{"REPLAYED", "DISCARDED"} {
		for {
			var ids []uint64
			if err := p.db.SelectContext(ctx, &ids, `SELECT id FROM t_dead_letter WHERE status = ? AND update_time < ?
				ORDER BY update_time, id LIMIT ?`, status, cutoff, p.o.Batch); err != nil {
				return rows, batches, err
			}
			if len(ids) == 0 {
				break
			}
			var n int64
			err := sqldb.InTx(ctx, p.db, func(tx *sqldb.Tx) error {
				n = 0
				q, args, err := sqlx.In("SELECT id FROM t_dead_letter WHERE id IN (?) AND "+deadLetterGone+" FOR UPDATE", ids, cutoff)
				if err != nil {
					return err
				}
				var locked []uint64
				if err := tx.SelectContext(ctx, &locked, q, args...); err != nil || len(locked) == 0 {
					return err
				}
				if q, args, err = sqlx.In("DELETE FROM t_dead_letter_event WHERE dead_letter_id IN (?)", locked); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, q, args...); err != nil {
					return err
				}
				if q, args, err = sqlx.In("DELETE FROM t_dead_letter WHERE id IN (?)", locked); err != nil {
					return err
				}
				res, err := tx.ExecContext(ctx, q, args...)
				if err != nil {
					return err
				}
				n, err = res.RowsAffected()
				return err
			})
			if err != nil {
				return rows, batches, err
			}
			rows += n
			batches++
			if n > 0 && p.o.OnPruned != nil {
				p.o.OnPruned(DeadLetters, n)
			}
			if len(ids) < p.o.Batch || n == 0 {
				break
			}
			if err := p.pause(ctx); err != nil {
				return rows, batches, err
			}
		}
	}
	return rows, batches, nil
}

func (p *pruner) pause(ctx context.Context) error {
	if p.o.Pause <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(p.o.Pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

func length(ids any) int {
	switch v := ids.(type) {
	case []uint64:
		return len(v)
	case []string:
		return len(v)
	}
	panic(fmt.Sprintf("prune: ids of type %T", ids))
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
