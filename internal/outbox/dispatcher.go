package outbox

import (
	"context"
	"crypto/tls"
	"fmt"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"
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
}

// Run publishes notices until ctx ends, reconnecting with backoff.
func (d *Dispatcher) Run(ctx context.Context) {
	bo := broker.Backoff{Max: 30 * time.Second}
	for ctx.Err() == nil {
		err := d.session(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := bo.Next()
		d.Log.Warn("outbox dispatcher: retrying", zap.Error(err), zap.Duration("backoff", wait))
		if !broker.Sleep(ctx, wait) {
			return
		}
	}
}

// Declare declares the notice exchange and queue.
func Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", Exchange, err)
	}
	if _, err := ch.QueueDeclare(Queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return fmt.Errorf("declare queue %s: %w", Queue, err)
	}
	if err := ch.QueueBind(Queue, "pay.#", Exchange, false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", Queue, err)
	}
	return nil
}

func (d *Dispatcher) session(ctx context.Context) error {
	conn, err := broker.Dial(d.URL, d.Name+" outbox", d.TLS)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := Declare(ch); err != nil {
		return err
	}
	ch.Close()
	pub := broker.NewPublisher(conn, 10*time.Second)
	defer pub.Close()
	for {
		n, err := d.DispatchOnce(ctx, pub)
		if err != nil {
			return err
		}
		if n < d.Batch && !broker.Sleep(ctx, d.Interval) {
			return nil
		}
	}
}

// DispatchOnce publishes up to Batch due notices, each with a confirm, and
// marks them SENT. Rows are locked with SKIP LOCKED so that replicas share the
// work. A failed publish schedules the notice again with backoff and returns
// the error. It returns how many notices it sent.
func (d *Dispatcher) DispatchOnce(ctx context.Context, pub *broker.Publisher) (int, error) {
	sent := 0
	var pubErr error
	err := sqldb.InTx(ctx, d.DB, func(tx *sqlx.Tx) error {
		var rows []struct {
			ID       int64  `db:"id"`
			BizNo    string `db:"biz_no"`
			Payload  []byte `db:"payload"`
			Attempts int    `db:"attempts"`
		}
		err := tx.SelectContext(ctx, &rows, `SELECT id, biz_no, payload, attempts FROM t_outbox
			WHERE status = 'PENDING' AND next_attempt_at <= CURRENT_TIMESTAMP(3)
			ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED`, d.Batch)
		if err != nil {
			return err
		}
		for _, r := range rows {
			pubErr = pub.Publish(ctx, Exchange, RoutingKey, amqp.Publishing{
				ContentType:  "application/json",
				DeliveryMode: amqp.Persistent,
				MessageId:    "outbox-" + strconv.FormatInt(r.ID, 10),
				Timestamp:    time.Now(),
				Type:         EventPaymentSucceeded,
				Body:         r.Payload,
			})
			if pubErr != nil {
				delay := min(1<<min(r.Attempts, 8), 300) // seconds: 1, 2, 4, ... 256, 300
				msg := pubErr.Error()
				if len(msg) > 1000 {
					msg = msg[:1000]
				}
				_, err := tx.ExecContext(ctx, `UPDATE t_outbox SET attempts = attempts + 1, last_error = ?,
					next_attempt_at = CURRENT_TIMESTAMP(3) + INTERVAL ? SECOND WHERE id = ?`, msg, delay, r.ID)
				d.Log.Warn("outbox: notice not published; will retry", zap.String("order_no", r.BizNo),
					zap.Int("attempt", r.Attempts+1), zap.Error(pubErr))
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE t_outbox SET status = 'SENT', attempts = attempts + 1,
				sent_time = CURRENT_TIMESTAMP(3) WHERE id = ?`, r.ID); err != nil {
				return err
			}
			sent++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: %w", err)
	}
	return sent, pubErr
}
