// Package trace records what happened to each order beyond its payment
// transaction (retries, terminal parking, duplicates, replays) and assembles
// an order's timeline for `paysvc trace`.
package trace

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"
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
	if len(e.Detail) > 1024 {
		e.Detail = e.Detail[:1024]
	}
	_, err := db.ExecContext(ctx, `INSERT INTO t_payment_event (order_no, event, error_class, attempt, detail, instance)
		VALUES (?, ?, ?, ?, ?, ?)`, e.OrderNo, e.Event, e.ErrorClass, e.Attempt, e.Detail, e.Instance)
	if err != nil {
		return fmt.Errorf("trace %s: %w", e.OrderNo, err)
	}
	return nil
}

// Recorder records events for one paysvc instance.
type Recorder struct {
	DB       *sqlx.DB
	Instance string
}

// Record writes e, stamped with the instance; a nil Recorder records nothing.
func (r *Recorder) Record(ctx context.Context, e Event) error {
	if r == nil {
		return nil
	}
	e.Instance = r.Instance
	return Record(ctx, r.DB, e)
}
