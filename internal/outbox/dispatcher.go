package outbox

import (
	"context"
	"crypto/tls"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// Dispatcher publishes pending notices.
type Dispatcher struct {
	DB       *sqlx.DB
	URL      string        // amqp URL
	TLS      *tls.Config   // for amqps://; nil: system roots
	Name     string        // connection name
	Interval time.Duration // poll interval when idle
	Batch    int           // notices per transaction
	Log      *zap.Logger
	// Handoff, if not nil, carries the order numbers of notices this
	// process committed leased to itself (Offer).
	Handoff chan []string
	// MarkDelay is how long the SENT marks of handed-over notices may wait
	// to share one UPDATE (0: DefaultMarkDelay). A notice published and not
	// yet marked when the process dies is sent again after its lease, as
	// any notice sent and not marked: notices are at least once.
	MarkDelay time.Duration
	// Linger is how long handed-over notices wait for more to share one
	// publish batch (0: DefaultLinger); a batch of Batch goes at once.
	Linger time.Duration
	// Blocked, if not nil, is set to 1 while the broker blocks the
	// dispatcher's connection (a resource alarm), and back to 0.
	Blocked prometheus.Gauge

	skipLocked atomic.Int32 // 0: not asked yet; 1: the server honours SKIP LOCKED; 2: it does not (leaseLock)
	marks      int          // UPDATE statements marking notices sent (tests)
	batches    atomic.Int64 // publish batches of handed-over notices (tests, read while Run runs)
}

// DefaultMarkDelay: the SENT marks of the notices handed over in this long
// share one statement (one commit, one redo log flush) instead of one per
// publish batch; markMax of them are marked at once. Both stay small: a
// notice sent and not marked still counts in paysvc_outbox_pending (at most
// markMax per replica; the NoticesPending alert reads the oldest notice's
// age, which a mark delay moves by DefaultMarkDelay at most).
const (
	DefaultMarkDelay = 100 * time.Millisecond
	markMax          = 100
)

// DefaultLinger: handed-over notices wait this long for more before they
// are read and published together, so that one read, one publish batch and
// one confirm wait serve many groups' notices instead of a few each, on the
// CPU and servers the payments use. A notice is published that much later;
// the payment is not.
const DefaultLinger = 50 * time.Millisecond

// stopBound bounds what a stop leaves a session to finish: the batch it had
// taken (its confirm wait, its reschedule) and the SENT marks. Then the
// connection's close (broker.CloseConn) is the rest of a stop.
const stopBound = 20 * time.Second

// Offer hands the dispatcher the notices of payments its own process
// committed, written leased to it (order.Store.NoticeLease): it publishes
// them without polling for them or leasing them again. Offer never blocks:
// an offer the dispatcher cannot take now is left to the poll, which takes
// the rows when their lease ends.
func (d *Dispatcher) Offer(orderNos []string) {
	select {
	case d.Handoff <- orderNos:
	default:
	}
}

// Run publishes notices until ctx ends, reconnecting with backoff.
func (d *Dispatcher) Run(ctx context.Context) {
	broker.Reconnect{
		Max: 30 * time.Second,
		Ended: func(err error, wait time.Duration) {
			d.Log.Warn("outbox dispatcher: retrying", zap.Error(err), zap.Duration("backoff", wait))
		},
	}.Run(ctx, d.session)
}

// Declare declares the notice exchange and queue. q.pay.notify is a quorum
// queue with an explicit delivery limit (20) and a dead-letter target,
// q.pay.notify.dead (classic, no limit): a notice its consumers keep
// rejecting is set aside there, never dropped (RabbitMQ 4.x drops a message
// past a quorum queue's default limit when it has no target).
func Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", Exchange, err)
	}
	if _, err := ch.QueueDeclare(DeadQueue, true, false, false, false, amqp.Table{"x-queue-type": "classic"}); err != nil {
		return fmt.Errorf("declare queue %s: %w", DeadQueue, err)
	}
	if _, err := ch.QueueDeclare(Queue, true, false, false, false, amqp.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          int64(20),
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": DeadQueue,
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	}); err != nil {
		return fmt.Errorf("declare queue %s (drain and delete a %s declared by an earlier paysvc: docs/design.md, \"Migrating to quorum queues\"): %w",
			Queue, Queue, err)
	}
	if err := ch.QueueBind(Queue, "pay.#", Exchange, false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", Queue, err)
	}
	return nil
}

// dispatchOffered publishes the pending notices of the offered order
// numbers and returns the ids of those sent, to be marked by the caller.
// They were written leased to this process: a plain read finds them, and no
// other dispatcher takes them before their lease ends. finish is a context
// a stop does not cancel (a batch taken is published, not left to its
// lease).
func (d *Dispatcher) dispatchOffered(finish context.Context, pub *broker.Publisher, orderNos []string) (sent []int64, err error) {
	for len(orderNos) > 0 {
		n := min(len(orderNos), broker.MaxBatch)
		q, args, err := sqlx.In(`SELECT id, biz_no, payload, attempts, traceparent FROM t_outbox
			WHERE biz_no IN (?) AND event_type = ? AND status = 'PENDING'`, orderNos[:n], EventPaymentSucceeded)
		if err != nil {
			return sent, err
		}
		var rows []notice
		rctx, cancel := context.WithTimeout(finish, 10*time.Second)
		err = d.DB.SelectContext(rctx, &rows, q, args...)
		cancel()
		if err != nil {
			return sent, fmt.Errorf("outbox: read offered notices: %w", err)
		}
		if len(rows) > 0 {
			ok, err := d.publish(finish, pub, rows)
			if sent = append(sent, ok...); err != nil {
				return sent, err
			}
		}
		orderNos = orderNos[n:]
	}
	return sent, nil
}

// LeaseTime is how long a notice taken by one dispatcher stays hidden from
// the others: longer than a batch's publish and confirm wait. A notice
// whose dispatcher died between its publish and its mark is sent again after
// it (notices are at least once; the order number is their idempotency key).
const LeaseTime = 60 * time.Second

// notice is a row taken for publishing.
type notice struct {
	ID          int64  `db:"id"`
	BizNo       string `db:"biz_no"`
	Payload     []byte `db:"payload"`
	Attempts    int    `db:"attempts"`
	Traceparent string `db:"traceparent"` // the payment's trace context, "" for none
}

// dispatchDue publishes up to Batch due notices and returns how many it
// sent. It takes them in a short transaction (SKIP LOCKED, so replicas
// share the work) that leases them for LeaseTime and commits at once:
// no row lock is held while publishing, so a blocked broker never stalls
// the payments' outbox inserts. It then publishes them outside any
// transaction with one confirm wait for the batch, and marks the sent ones
// in one statement; a notice that failed is scheduled again with backoff
// (1 s, 2 s, 4 s... 5 min) and the first failure is returned. What
// follows the lease (the publishes, the reschedule, the marks) runs on
// finish, which ctx's end does not cancel.
func (d *Dispatcher) dispatchDue(ctx, finish context.Context, pub *broker.Publisher) (int, error) {
	lock, err := d.leaseLock(ctx)
	if err != nil {
		return 0, fmt.Errorf("outbox: lease: %w", err)
	}
	var rows []notice
	err = sqldb.InTx(ctx, d.DB, func(tx *sqldb.Tx) error {
		err := tx.SelectContext(ctx, &rows, `SELECT id, biz_no, payload, attempts, traceparent FROM t_outbox
			WHERE status = 'PENDING' AND next_attempt_at <= CURRENT_TIMESTAMP(3)
			ORDER BY next_attempt_at, id LIMIT ? `+lock, min(d.Batch, broker.MaxBatch))
		if err != nil || len(rows) == 0 {
			return err
		}
		q, args, err := sqlx.In(`UPDATE t_outbox SET attempts = attempts + 1,
			next_attempt_at = CURRENT_TIMESTAMP(3) + INTERVAL ? SECOND WHERE id IN (?)`, int(LeaseTime/time.Second), ids(rows))
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, q, args...)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: lease: %w", err)
	}
	if len(rows) == 0 {
		return 0, nil
	}
	for i := range rows {
		rows[i].Attempts++ // the lease counted this attempt
	}
	sent, err := d.publish(finish, pub, rows)
	if merr := d.markSent(finish, sent); merr != nil {
		return 0, merr
	}
	return len(sent), err
}

// leaseLock is the lease's locking clause: FOR UPDATE SKIP LOCKED, so
// replicas share the work, where the server honours it; FOR UPDATE on
// TiDB, whose SKIP LOCKED locks nothing, so that two replicas would lease
// and send the same notices. There a replica waits for another's lease
// (a short transaction), then reads the rows still due. Asked once.
func (d *Dispatcher) leaseLock(ctx context.Context) (string, error) {
	switch d.skipLocked.Load() {
	case 1:
		return "FOR UPDATE SKIP LOCKED", nil
	case 2:
		return "FOR UPDATE", nil
	}
	ok, err := sqldb.SkipLockedLocks(ctx, d.DB)
	if err != nil {
		return "", err
	}
	if ok {
		d.skipLocked.Store(1)
	} else {
		d.skipLocked.Store(2)
	}
	return d.leaseLock(ctx)
}

// markSent marks the sent notices in one statement within 10 s, on finish
// (a context a stop does not cancel: the publishes are done). Sent and not
// marked, a notice is sent again after its lease.
func (d *Dispatcher) markSent(finish context.Context, sent []int64) error {
	if len(sent) == 0 {
		return nil
	}
	mctx, cancel := context.WithTimeout(finish, 10*time.Second)
	defer cancel()
	q, args, err := sqlx.In(`UPDATE t_outbox SET status = 'SENT', sent_time = CURRENT_TIMESTAMP(3) WHERE id IN (?)`, sent)
	if err == nil {
		d.marks++
		_, err = d.DB.ExecContext(mctx, q, args...)
	}
	if err != nil {
		return fmt.Errorf("outbox: mark %d notices sent: %w", len(sent), err)
	}
	return nil
}

// publish sends leased rows, with one confirm wait for the batch, and
// schedules the failed ones again with backoff (1 s, 2 s, 4 s... 5 min); it
// returns the ids of the sent ones (for markSent) and the first failure.
// finish is a context a stop does not cancel: a batch under way finishes
// (the publisher's timeout bounds it); cut short, the notices the broker
// had already taken would be rescheduled and sent again.
func (d *Dispatcher) publish(finish context.Context, pub *broker.Publisher, rows []notice) ([]int64, error) {
	msgs := make([]amqp.Publishing, len(rows))
	for i, r := range rows {
		var headers amqp.Table
		if r.Traceparent != "" {
			headers = amqp.Table{"traceparent": r.Traceparent}
		}
		msgs[i] = amqp.Publishing{
			Headers:      headers,
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    "outbox-" + strconv.FormatInt(r.ID, 10),
			Timestamp:    time.Now(),
			Type:         EventPaymentSucceeded,
			Body:         r.Payload,
		}
	}
	errs := pub.PublishBatch(finish, Exchange, RoutingKey, msgs)
	var sent, failed []notice
	var firstErr error
	for i, r := range rows {
		if errs[i] == nil {
			sent = append(sent, r)
			continue
		}
		failed = append(failed, r)
		if firstErr == nil {
			firstErr = errs[i]
		}
		d.Log.Warn("outbox: notice not published; will retry", zap.String("order_no", r.BizNo),
			zap.Int("attempt", r.Attempts), zap.Error(errs[i]))
	}
	// The reschedule runs even after a stop: the publishes are done.
	mctx, cancel := context.WithTimeout(finish, 10*time.Second)
	defer cancel()
	if len(failed) > 0 {
		msg := firstErr.Error()
		if len(msg) > 1000 {
			msg = msg[:1000]
		}
		q, args, err := sqlx.In(`UPDATE t_outbox SET last_error = ?,
			next_attempt_at = CURRENT_TIMESTAMP(3) + INTERVAL LEAST(POW(2, LEAST(attempts - 1, 9)), 300) SECOND
			WHERE id IN (?)`, msg, ids(failed))
		if err == nil {
			_, err = d.DB.ExecContext(mctx, q, args...)
		}
		if err != nil {
			return ids(sent), fmt.Errorf("outbox: reschedule: %w (after %w)", err, firstErr)
		}
	}
	return ids(sent), firstErr
}

func ids(rows []notice) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}
