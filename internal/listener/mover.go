package listener

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/metrics"
)

// Mover brings retry copies back from the wait queues itself: it consumes
// each wait queue, holds each copy until it is due (when it was published
// there, x-last-failed-at, plus the queue's delay), publishes it to
// q.pay.success through the default exchange with publisher confirms and
// mandatory, and only then acks it.
//
// The wait queues' TTL and dead-lettering stay as they are, as the path a
// copy takes when no mover consumes (every instance down). They are not
// relied on alone: a quorum queue dead-letters expired messages at least
// once through a worker on its leader, and after leader changes that worker
// has been seen to stop, leaving expired copies in the queue, counted in
// its messages but neither ready nor unacked, invisible to queue.declare
// and to paysvc, while their payments stay unpaid (docs/design.md,
// "Retries the broker does not strand"). A copy a consumer holds does not
// expire, so a copy the mover took never meets that worker.
//
// A copy moved twice (the mover's publish confirmed and its ack lost, or
// expired and moved both) is harmless: the payment is idempotent.
type Mover struct {
	URL    string
	Name   string
	TLS    *tls.Config // for amqps://; nil: system roots
	Delays []time.Duration
	Log    *zap.Logger
	// Metrics, if not nil, counts the copies moved and held.
	Metrics *metrics.Metrics
	// PublishTimeout bounds one publish and its confirm.
	PublishTimeout time.Duration
	// ConsumerTimeout, if not 0, is the consumes' x-consumer-timeout, as the
	// consumer's: the mover holds each copy for its queue's delay.
	ConsumerTimeout time.Duration
	// Ledger, if not nil, is the retry ledger: a copy moved is back.
	Ledger *idem.Retries
	// now is the clock (tests); nil: time.Now.
	now func() time.Time
}

// moverPrefetch is how many copies of each wait queue the broker may send
// the mover ahead of its acks: the copies it holds until they are due. A
// copy beyond it waits in the queue and, if it expires there first (a
// burst of more retries than this within one delay), takes the
// dead-letter path. Copies are small (a payment message, 64 KiB at most).
const moverPrefetch = 1000

// moverWorkers is how many copies of one wait queue are published at once.
const moverWorkers = 4

// moverMaxBackoff caps the mover's reconnect backoff and its wait between
// attempts to publish a held copy.
const moverMaxBackoff = 15 * time.Second

// Run moves retry copies until ctx ends, reconnecting with backoff.
func (m *Mover) Run(ctx context.Context) {
	if len(m.Delays) == 0 {
		return
	}
	broker.Reconnect{
		Max: moverMaxBackoff,
		Ended: func(err error, wait time.Duration) {
			if m.Metrics != nil {
				m.Metrics.Reconnects.WithLabelValues("mover").Inc()
			}
			m.Log.Warn("mover: session ended; reconnecting", zap.Error(err), zap.Duration("backoff", wait))
		},
	}.Run(ctx, m.session)
}

// session consumes every wait queue on one connection until ctx ends or the
// connection, a channel or a consume ends. The copies in hand and not
// moved go back to their queues as the connection closes.
func (m *Mover) session(ctx context.Context) error {
	conn, err := broker.Dial(m.URL, m.Name+" mover", m.TLS)
	if err != nil {
		return err
	}
	defer broker.CloseConn(conn) // bounded: a blocked broker may never answer
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var args amqp.Table
	if m.ConsumerTimeout > 0 {
		args = amqp.Table{"x-consumer-timeout": m.ConsumerTimeout.Milliseconds()}
	}
	ended := make(chan error, len(m.Delays))
	var wg sync.WaitGroup
	for _, delay := range m.Delays {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("mover: channel: %w", err)
		}
		if err := ch.Qos(moverPrefetch, 0, false); err != nil {
			return fmt.Errorf("mover: qos: %w", err)
		}
		queue := WaitQueue(delay)
		deliveries, err := ch.Consume(queue, "", false /* autoAck: ack once the copy is confirmed */, false, false, false, args)
		if err != nil {
			return fmt.Errorf("mover: consume %s: %w", queue, err)
		}
		for range moverWorkers {
			wg.Go(func() {
				pub := broker.NewPublisher(conn, m.PublishTimeout)
				defer pub.Close()
				for d := range deliveries {
					if err := m.move(sctx, pub, d, queue, delay); err != nil {
						select {
						case ended <- err:
						default:
						}
						cancel()
						return
					}
				}
				select {
				case ended <- fmt.Errorf("mover: %s: deliveries closed (the channel ended, or the broker cancelled the consumer)", queue):
				default:
				}
				cancel()
			})
		}
	}
	m.Log.Info("mover: consuming the wait queues", zap.Int("queues", len(m.Delays)))
	<-sctx.Done()
	broker.CloseConn(conn) // the workers' deliveries close with it
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	select {
	case err := <-ended:
		return err
	default:
		return sctx.Err()
	}
}

// move holds d until it is due, publishes it to the main queue and acks
// it. It returns an error only when the session must end (ctx ended, or the
// ack failed: the channel is gone); a copy not moved then goes back to its
// queue.
func (m *Mover) move(ctx context.Context, pub *broker.Publisher, d amqp.Delivery, queue string, delay time.Duration) error {
	held := m.gauge()
	held.Inc()
	defer held.Dec()
	now := m.clock()
	wait := due(d, delay, now).Sub(now)
	if wait > 0 && !broker.Sleep(ctx, wait) {
		return ctx.Err()
	}
	msg := amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, Priority: d.Priority, CorrelationId: d.CorrelationId,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	}
	for bo := (broker.Backoff{Max: moverMaxBackoff}); ; {
		// The default exchange: it routes to q.pay.success by name, with no
		// binding that an operator's change could take away.
		err := pub.Publish(ctx, "", MainQueue, msg)
		if err == nil {
			break
		}
		wait := bo.Next()
		m.Log.Warn("mover: copy not moved; holding it and trying again", zap.String("queue", queue),
			zap.Duration("backoff", wait), zap.Error(err))
		if !broker.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
	if err := d.Ack(false); err != nil {
		return fmt.Errorf("mover: ack %s: %w", queue, err)
	}
	if m.Metrics != nil {
		m.Metrics.RetryCopiesMoved.Inc()
	}
	if m.Ledger != nil {
		retryBack(ctx, m.Ledger, d, m.Log)
	}
	return nil
}

// due is when a copy in a wait queue of delay is due back: when paysvc
// published it there (x-last-failed-at) plus the delay; for a copy without
// a readable time, or one that claims a time in the future, from now.
func due(d amqp.Delivery, delay time.Duration, now time.Time) time.Time {
	failed, err := time.Parse(time.RFC3339Nano, headerString(d.Headers, HeaderLastFailedAt))
	if err != nil || failed.After(now) {
		return now.Add(delay)
	}
	return failed.Add(delay)
}

func (m *Mover) clock() time.Time {
	if m.now != nil {
		return m.now()
	}
	return time.Now()
}

type gauge interface {
	Inc()
	Dec()
}

type noGauge struct{}

func (noGauge) Inc() {}
func (noGauge) Dec() {}

func (m *Mover) gauge() gauge {
	if m.Metrics == nil {
		return noGauge{}
	}
	return m.Metrics.RetryCopiesHeld
}

// retryCopy is the ledger's entry for d, a copy paysvc published to a wait
// queue (x-routed-to); false for any other message.
func retryCopy(d amqp.Delivery) (idem.RetryCopy, bool) {
	q := headerString(d.Headers, HeaderRoutedTo)
	if !strings.HasPrefix(q, waitPrefix) {
		return idem.RetryCopy{}, false
	}
	p, err := DecodePayment(d.Body)
	if err != nil {
		return idem.RetryCopy{}, false
	}
	return idem.RetryCopy{OrderNo: p.OrderNo, Attempt: retryCount(d.Headers), Queue: q}, true
}

// retryBack removes d, a copy back from its wait queue, from the ledger
// (bounded; a failure is logged: the entry shows overdue until pruned).
func retryBack(ctx context.Context, ledger *idem.Retries, d amqp.Delivery, log *zap.Logger) {
	c, ok := retryCopy(d)
	if !ok {
		return
	}
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateWriteTimeout)
	defer cancel()
	if err := ledger.Back(bg, c); err != nil {
		log.Warn("retry ledger: could not mark a copy back", zap.String("order_no", c.OrderNo),
			zap.String("queue", c.Queue), zap.Error(err))
	}
}

// retryOverdue is how long after it is due a copy not back counts as
// overdue: its queue's delay, and a minute at least.
func retryOverdue(delay time.Duration) time.Duration { return max(delay, time.Minute) }
