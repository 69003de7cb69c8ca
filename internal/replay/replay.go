// Package replay sends dead letters back through the normal path: to
// q.pay.success, where every guard applies again, with a fresh retry count,
// at a bounded rate, with an audit row per message. A dry run predicts what
// would happen to each without changing anything.
package replay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/order"
)

// Publisher publishes with confirms; *broker.Publisher is one.
type Publisher interface {
	Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
}

// DefaultEvery is the gap between two replays of one bulk action: 20 a
// second, as `paysvc dlq replay --rate` by default. The admin page uses it.
const DefaultEvery = 50 * time.Millisecond

// DefaultTimeout bounds one replay, from the row's lock to its mark's
// COMMIT: room for a connection (5 s to dial), the row's lock wait (5 s by
// default), the publish (5 s to dial the broker, 10 s for the confirm) and
// the statements.
const DefaultTimeout = 30 * time.Second

// recordTimeout bounds the history line written for a replay that did not
// end in its mark, on a fresh connection after the replay's own bound.
const recordTimeout = 10 * time.Second

// Replayer replays dead letters.
type Replayer struct {
	Store   *deadletter.Store
	Orders  *order.Store
	DB      *sqlx.DB
	Publish Publisher     // nil for dry runs
	Every   time.Duration // minimum gap between two replays (rate limit)
	Timeout time.Duration // bound on one replay (0: DefaultTimeout)
}

// Selection names dead letters in bulk: every NEW one of a class, or every
// NEW one. (Single dead letters are named by id or order number: see
// deadletter.Store.FindOrder and deadletter.Choose.)
type Selection struct {
	Class string
	All   bool
}

// ErrNoSelection: nothing selected.
var ErrNoSelection = errors.New("replay: give order numbers, --id, --class, or --all")

// Select resolves a selection to NEW rows.
func (r *Replayer) Select(ctx context.Context, sel Selection) ([]deadletter.DeadLetter, error) {
	if sel.Class == "" && !sel.All {
		return nil, ErrNoSelection
	}
	return r.Store.List(ctx, deadletter.Filter{Class: sel.Class, Status: deadletter.New, Limit: 100000})
}

// Result is what happened, or would happen, to one dead letter.
type Result struct {
	ID      int64
	OrderNo string
	Outcome string // replayed, skipped, failed, outcome unknown; for a dry run the prediction
	Err     error
}

// Replay replays each row (or, with dryRun, predicts), in order, waiting
// Every between two publishes. A row in status REPLAYED is skipped: its copy
// is already back in the queue, or applied.
func (r *Replayer) Replay(ctx context.Context, rows []deadletter.DeadLetter, operator, reason string, dryRun bool) ([]Result, error) {
	if strings.TrimSpace(reason) == "" {
		return nil, errors.New("replay: a reason is required")
	}
	if err := deadletter.CheckAudit(operator, reason); err != nil {
		return nil, fmt.Errorf("replay: %w", err) // before any publish: the history could not record it
	}
	var out []Result
	var last time.Time
	for _, d := range rows {
		res := Result{ID: d.ID, OrderNo: d.Order()}
		switch {
		case dryRun:
			res.Outcome = r.Predict(ctx, d)
		case d.Status == deadletter.Replayed:
			res.Outcome = "skipped: already replayed"
		default:
			if wait := r.Every - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return out, ctx.Err()
				case <-time.After(wait):
				}
			}
			last = time.Now()
			res.Err = r.replayOne(ctx, d, operator, reason)
			switch {
			case errors.Is(res.Err, broker.ErrUnconfirmed):
				res.Outcome = "outcome unknown: " + res.Err.Error()
			case res.Err != nil:
				res.Outcome = "failed: " + res.Err.Error()
			default:
				res.Outcome = "replayed to " + listener.MainQueue
			}
		}
		out = append(out, res)
	}
	return out, nil
}

// replayOne publishes d's copy and marks d REPLAYED. Once begun, it runs to
// its mark whatever the caller's context (a closed browser, a signal): cut
// between its publish and its mark, its outcome would be unknown. It has a
// bound of its own instead (Timeout): a database that stops answering
// (a dead network path, no reset) would otherwise hold the replay, and the
// admin request or the command waiting on it, for the kernel's TCP
// timeout, and a statement whose context has no end is never killed on the
// server. Past the bound the statement is killed, which ends the mark's
// transaction on the server (rolled back, unless its COMMIT got there);
// a copy already published is then written into the row's history on a
// connection of its own.
func (r *Replayer) replayOne(ctx context.Context, d deadletter.DeadLetter, operator, reason string) error {
	if d.Status != deadletter.New && d.Status != deadletter.Discarded {
		return fmt.Errorf("dead letter %d is %s", d.ID, d.Status)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(r.Timeout, DefaultTimeout))
	defer cancel()
	// record writes result into the row's history for a replay that did
	// not end in its mark, and returns err, saying so if the line is
	// missing.
	record := func(err error, result string) error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		defer cancel()
		if rerr := r.Store.RecordFailure(rctx, d.ID, operator, reason, result); rerr != nil {
			return fmt.Errorf("%w; the row's history could not record it: %w", err, rerr)
		}
		return err
	}
	msg := amqp.Publishing{
		Headers: replayHeaders(d, operator, reason), ContentType: "application/json",
		DeliveryMode: amqp.Persistent, MessageId: fmt.Sprintf("replay-%d-%d", d.ID, time.Now().UnixNano()),
		Timestamp: time.Now(), Body: d.Body,
	}
	// The row stays locked from its check to its mark (Store.Replay): a row
	// another operator discarded or replayed since it was read is refused,
	// and a re-parking of the copy waits for the mark.
	var pubErr error
	published := false
	err := r.Store.Replay(ctx, d, operator, reason, "published to "+listener.MainQueue, func(ctx context.Context) error {
		pubErr = r.Publish.Publish(ctx, "", listener.MainQueue, msg)
		published = pubErr == nil
		return pubErr
	})
	switch {
	case errors.Is(pubErr, broker.ErrUnconfirmed):
		// Written, never confirmed: the copy may be in the queue and the
		// payment applied, or not. The row stays as it was (replayable: a
		// second copy meets the guards); its history says which it may be.
		err = fmt.Errorf("%w; the copy may be in %s: check the order (paysvc trace) before discarding the row; "+
			"replaying it again is safe (a second copy is a duplicate)", pubErr, listener.MainQueue)
		return record(err, err.Error())
	case pubErr != nil:
		return record(err, pubErr.Error())
	case published && err != nil:
		// The copy is on its way, and the transaction's end (its COMMIT:
		// the mark is written before the publish) failed, taking the event
		// with it: the row's history must still say a copy went out.
		err = fmt.Errorf("published to %s; marking it REPLAYED: %w", listener.MainQueue, err)
		return record(err, err.Error())
	}
	return err
}

// replayHeaders keeps the producer's own headers and starts the retry count
// afresh: none of the x-retry-*, x-error-*, x-*-failed-at or x-death headers.
func replayHeaders(d deadletter.DeadLetter, operator, reason string) amqp.Table {
	h := amqp.Table{}
	var orig map[string]any
	if json.Unmarshal([]byte(d.Headers), &orig) == nil {
		for k, v := range orig {
			if s, ok := v.(string); ok && !strings.HasPrefix(k, "x-") {
				h[k] = s
			}
		}
	}
	h["x-replay-of"] = strconv.FormatInt(d.ID, 10)
	h["x-replay-by"] = operator
	h["x-replay-reason"] = reason
	return h
}

// Predict says what replaying d would do now, changing nothing.
func (r *Replayer) Predict(ctx context.Context, d deadletter.DeadLetter) string {
	p, err := listener.DecodePayment(d.Body)
	if err != nil {
		return "would fail: " + err.Error()
	}
	switch err := r.Orders.Check(ctx, p); {
	case errors.Is(err, order.ErrAlreadyPaid):
		return "already paid: no-op (acked as duplicate)"
	case errors.Is(err, order.ErrNotFound):
		return "would retry: order not found"
	case errors.Is(err, order.ErrMismatch):
		return "would fail: amount or user differ from the order"
	case errors.Is(err, order.ErrNotPayable):
		return "would fail: " + err.Error()
	case err != nil:
		return "unknown: " + err.Error()
	}
	bal, err := account.Balance(ctx, r.DB, p.UserID)
	switch {
	case errors.Is(err, account.ErrNoAccount):
		return fmt.Sprintf("would retry: user %d has no account", p.UserID)
	case err != nil:
		return "unknown: " + err.Error()
	case bal < p.Amount:
		return fmt.Sprintf("would fail: balance %s < amount %s (user %d)", bal, p.Amount, p.UserID)
	}
	return fmt.Sprintf("would deduct %s from user %d (balance %s → %s)", p.Amount, p.UserID, bal, bal-p.Amount)
}
