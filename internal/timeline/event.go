// Package timeline records what happened to each order beyond its payment
// transaction (retries, terminal parking, duplicates, replays) and assembles
// an order's timeline for `paysvc trace`.
package timeline

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/batch"
)

// Event is one step in an order's history.
type Event struct {
	OrderNo    string
	Event      string // RETRY, TERMINAL, DUPLICATE, REQUEUE, REPLAYED, DISCARDED, REVERSED
	ErrorClass string
	Attempt    int
	Detail     string
	Instance   string
}

// Record writes e. Recording is best effort for the caller: the payment's
// truth lives in its own tables.
func Record(ctx context.Context, db sqlx.ExecerContext, e Event) error {
	return insert(ctx, db, []Event{e})
}

// insert writes events in one statement.
func insert(ctx context.Context, db sqlx.ExecerContext, events []Event) error {
	var q strings.Builder
	q.WriteString("INSERT INTO t_payment_event (order_no, event, error_class, attempt, detail, instance) VALUES ")
	args := make([]any, 0, 6*len(events))
	for i, e := range events {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?, ?, ?)")
		if len(e.Detail) > 1024 {
			e.Detail = e.Detail[:1024]
		}
		args = append(args, e.OrderNo, e.Event, e.ErrorClass, e.Attempt, e.Detail, e.Instance)
	}
	if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
		return fmt.Errorf("trace %s: %w", events[0].OrderNo, err)
	}
	return nil
}

// Recorder records events for one paysvc instance.
type Recorder struct {
	DB       *sqlx.DB
	Instance string

	rows *batch.Collector[*row] // nil: one INSERT per event
}

type row struct {
	ctx  context.Context
	e    Event
	done chan error
}

// Start makes events recorded at the same moment share one INSERT (and one
// commit), up to size rows, on conns connections. Call it before r is used;
// stop waits for the inserts under way. After stop, events go alone.
func (r *Recorder) Start(conns, size int) (stop func()) {
	r.rows = batch.Start(max(conns, 1), size, func(rows []*row) {
		events := make([]Event, len(rows))
		for i, w := range rows {
			events[i] = w.e
		}
		ctx, cancel := batch.Context(rows, func(w *row) context.Context { return w.ctx })
		defer cancel()
		err := insert(ctx, r.DB, events)
		for _, w := range rows {
			w.done <- err
		}
	})
	return r.rows.Stop
}

// Record writes e, stamped with the instance, and returns once it is
// stored (or could not be); a nil Recorder records nothing.
func (r *Recorder) Record(ctx context.Context, e Event) error {
	if r == nil {
		return nil
	}
	e.Instance = r.Instance
	w := &row{ctx: ctx, e: e, done: make(chan error, 1)}
	taken, err := r.rows.Send(ctx, w)
	switch {
	case err != nil:
		return fmt.Errorf("trace %s: %w", e.OrderNo, err)
	case !taken:
		return Record(ctx, r.DB, e)
	}
	return <-w.done
}
