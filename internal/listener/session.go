package listener

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
)

// session runs one connection: declare, consume, dispatch to workers, and on
// the way out cancel the consumer, drain the workers and close. It returns
// why it ended (nil when ctx was cancelled).
func (c *Consumer) session(ctx context.Context) error {
	host, _ := os.Hostname()
	conn, err := broker.Dial(c.cfg.URL, c.cfg.ConnectionName, c.cfg.TLS)
	if err != nil {
		if broker.LoginRefused(err) {
			return &fatalError{err: err, ambiguous: true}
		}
		return err
	}
	defer closeWithin(closeTimeout, func() { conn.Close() })
	node := conn.RemoteAddr().String()
	if prev := c.node.Swap(&node); prev != nil && *prev != node {
		c.m.Failovers.WithLabelValues("broker").Inc()
		c.log.Warn("broker node changed", zap.String("from", *prev), zap.String("broker_node", node))
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	// The retry and terminal copies go out on a connection of their own: in
	// a resource alarm the broker stops reading a connection that
	// publishes, acks included, and the payments that need no copy must
	// still be acked.
	pubConn, err := broker.Dial(c.cfg.URL, c.cfg.ConnectionName+" copies", c.cfg.TLS)
	if err != nil {
		return err
	}
	defer broker.CloseConn(pubConn) // bounded: blocked, the broker never answers a close
	// A new connection is not blocked; the gauge is this session's.
	blocked := c.m.BrokerBlocked.WithLabelValues("consumer")
	blocked.Set(0)
	defer blocked.Set(0)
	blocking := broker.WatchBlocking(pubConn, func(active bool, reason string) {
		if active {
			c.m.BrokerBlocked.WithLabelValues("consumer").Set(1)
			c.log.Warn("broker blocks publishing (resource alarm): messages that need a retry or terminal copy are held until it clears",
				zap.String("reason", reason))
			return
		}
		c.m.BrokerBlocked.WithLabelValues("consumer").Set(0)
		c.log.Info("broker unblocked publishing", zap.String("reason", reason))
	})
	defer blocking.Stop() // before the gauge's reset above

	setup, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp channel: %w", err)
	}
	if err := DeclareTopology(setup, Topology{Delays: c.cfg.Retry.Delays,
		MainQueueType: c.cfg.MainQueueType, DeliveryLimit: c.cfg.DeliveryLimit}); err != nil {
		if refused(err) {
			return &fatalError{err: err}
		}
		return err
	}
	setup.Close()

	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp channel: %w", err)
	}
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("amqp qos: %w", err)
	}
	tag := fmt.Sprintf("paysvc-%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
	var consumeArgs amqp.Table
	if c.cfg.ConsumerTimeout > 0 {
		consumeArgs = amqp.Table{"x-consumer-timeout": c.cfg.ConsumerTimeout.Milliseconds()}
	}
	deliveries, err := ch.Consume(MainQueue, tag,
		false, // autoAck: ack only after the outcome is durable
		false, // exclusive: competing consumers share the queue
		false, false, consumeArgs)
	if err != nil {
		return fmt.Errorf("amqp consume: %w", err)
	}

	// Workers finish what they started even when ctx is cancelled, until the
	// drain timeout cancels procCtx. A worker holding a message through an
	// outage lets go of it when the session ends (sessCtx).
	procCtx, stopProc := context.WithCancel(context.WithoutCancel(ctx))
	defer stopProc()
	// Not a child of ctx: at shutdown the held workers let go only after
	// the consumer is cancelled (stopIntake).
	sessCtx, endSession := context.WithCancel(context.WithoutCancel(ctx))
	defer endSession()
	work := make(chan amqp.Delivery)
	pause := make(chan error, 1)
	acks := newCoalescer(ch) // the workers' acks, coalesced (ack.go)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			cp := copier{pub: broker.NewPublisher(pubConn, c.cfg.PublishTimeout), blocking: blocking,
				maxBackoff: c.cfg.MaxBackoff, log: c.log}
			defer cp.pub.Close()
			for d := range work {
				d.Acknowledger = acks
				c.process(procCtx, sessCtx, cp, d, pause)
			}
		})
	}
	c.setReady(true)
	c.log.Info("consuming", zap.String("queue", MainQueue), zap.String("broker_node", node), zap.String("consumer_tag", tag),
		zap.Int("prefetch", c.cfg.Prefetch), zap.Int("workers", c.cfg.Workers))

	held, reason := dispatch(ctx, deliveries, work, pause, connClosed, chClosed)
	c.setReady(false)

	// Stop intake (a dead channel sends nothing anyway), then let the
	// workers holding messages through an outage go.
	teardown := time.Now()
	cancelled := false // cancel-ok came: the client closes deliveries
	stopIntake(func() {
		if !ch.IsClosed() && !conn.IsClosed() {
			var err error
			cancelled = closeWithin(closeTimeout, func() {
				err = ch.Cancel(tag, false) // noWait=false: wait for cancel-ok
			}) && err == nil
		}
	}, endSession)
	close(work)
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	stopped := true // every worker returned: none holds a delivery
	select {
	case <-drained:
	case <-time.After(c.cfg.DrainTimeout):
		stopped = false
		c.log.Warn("drain timeout: abandoning in-flight messages; the broker will redeliver them",
			zap.Duration("drain_timeout", c.cfg.DrainTimeout))
		stopProc()
		select {
		case <-drained:
		case <-time.After(closeTimeout):
			// A worker stuck in a write to a blocked connection: closing
			// the connection below frees it; nothing it holds was acked.
			c.log.Error("workers did not stop after the drain timeout; closing the connection under them")
		}
	}
	// The acks still held go out before the channel closes (bounded: a
	// blocked connection may not take them). Then, if every worker has
	// stopped, the prefetched messages no worker started go back with one
	// nack: on RabbitMQ 4.x a nack (multiple) does not count toward a
	// quorum queue's delivery limit, where the channel's close would, once
	// for every message prefetched at every restart. A message that held
	// a worker past the drain timeout is left to the close, and counts.
	// Whatever is left unsettled, the close returns. A blocked broker may
	// never answer the close: bound the wait (the deferred conn.Close is
	// bounded too).
	if closeWithin(closeTimeout, acks.Close) && stopped && cancelled && !ch.IsClosed() {
		var returned int
		var err error
		if closeWithin(closeTimeout, func() {
			if returned, err = returnUnstarted(ch, deliveries, held); err == nil && returned > 0 {
				// A nack the broker refuses closes the channel, later: a
				// round trip tells.
				_, err = ch.QueueDeclarePassive(MainQueue, true, false, false, false, nil)
			}
		}) && (returned > 0 || err != nil) {
			log := c.log.Info
			if err != nil {
				log = c.log.Warn
			}
			log("prefetched messages no worker started returned to the queue",
				zap.Int("messages", returned), zap.Error(err))
		}
	}
	closeWithin(closeTimeout, func() { ch.Close() })
	c.log.Debug("session torn down", zap.Duration("duration", time.Since(teardown)), zap.NamedError("error", reason))
	return reason
}

// stopIntake ends a session's intake: cancel first (the broker sends this
// consumer nothing more), and only then release (the workers holding
// messages through an outage let go, and nack them). A nack before the
// cancel could bring a message straight back to this consumer, to be
// returned a second time when the channel closes: two counts toward a
// quorum queue's delivery limit where one would do.
func stopIntake(cancel, release func()) {
	cancel()
	release()
}

// closeTimeout bounds each step of a session's teardown (the consumer's
// cancel, the last acks, the channel's and the connection's close) and the
// wait for workers past the drain timeout: a blocked broker may never
// answer.
const closeTimeout = 5 * time.Second

// closeWithin runs f, waiting for it at most d, and reports whether f
// returned in time.
func closeWithin(d time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// returnUnstarted gives the broker back the deliveries of a cancelled
// consumer that no worker started: held (the delivery tag dispatch took
// but never handed over, or 0) and those still buffered in deliveries,
// which the client closes once the cancel is done. One nack with
// multiple=true and requeue=true up to the highest of their tags returns
// them: called once every worker has stopped and their acks are written,
// nothing else below it is unsettled, and nothing settled is named again.
// The tag must be unsettled, or the broker closes the channel: it is one
// no worker ever saw. It reports how many deliveries it returned.
func returnUnstarted(ch amqp.Acknowledger, deliveries <-chan amqp.Delivery, held uint64) (int, error) {
	n, last := 0, held
	if held > 0 {
		n++
	}
	for d := range deliveries {
		n++
		last = max(last, d.DeliveryTag)
	}
	if last == 0 {
		return 0, nil
	}
	return n, ch.Nack(last, true, true)
}

// dispatch hands deliveries to workers until ctx ends, a worker asks for a
// pause, or the connection, channel or delivery stream ends. A delivery
// taken but not handed over stays unacked; dispatch returns its tag (held)
// for the session's teardown to return it.
func dispatch(ctx context.Context, deliveries <-chan amqp.Delivery, work chan<- amqp.Delivery,
	pause <-chan error, connClosed, chClosed <-chan *amqp.Error) (held uint64, err error) {
	closedErr := func(what string, e *amqp.Error) error {
		if e == nil {
			return fmt.Errorf("amqp %s closed", what)
		}
		return fmt.Errorf("amqp %s closed: %w", what, e)
	}
	for {
		select {
		case <-ctx.Done():
			return 0, nil
		case err := <-pause:
			return 0, err
		case e := <-connClosed:
			return 0, closedErr("connection", e)
		case e := <-chClosed:
			return 0, closedErr("channel", e)
		case d, ok := <-deliveries:
			if !ok {
				return 0, errors.New("amqp deliveries closed: consumer cancelled")
			}
			select {
			case work <- d:
			case <-ctx.Done():
				return d.DeliveryTag, nil
			case err := <-pause:
				return d.DeliveryTag, err
			case e := <-connClosed:
				return d.DeliveryTag, closedErr("connection", e)
			case e := <-chClosed:
				return d.DeliveryTag, closedErr("channel", e)
			}
		}
	}
}

// signal asks dispatch for a pause (a new session) unless one is asked already.
func signal(pause chan<- error, err error) {
	select {
	case pause <- err:
	default:
	}
}
