package listener

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
)

// session runs one connection: connect, open the consumer, start the
// workers, dispatch deliveries to them until the session ends, then tear
// down (cancel the consumer, drain the workers, close). It returns why it
// ended (nil when ctx was cancelled).
func (c *Consumer) session(ctx context.Context) error {
	conns, err := c.connect()
	if err != nil {
		return err
	}
	defer conns.close()
	sub, err := c.openConsumer(conns.conn)
	if err != nil {
		return err
	}
	ws := c.startWorkers(ctx, conns, sub.ch)
	defer ws.end()
	c.setReady(true)
	c.log.Info("consuming", zap.String("queue", MainQueue), zap.String("broker_node", conns.node), zap.String("consumer_tag", sub.tag),
		zap.Int("prefetch", c.cfg.Prefetch), zap.Int("workers", c.cfg.Workers))

	held, reason := dispatch(ctx, sub.deliveries, ws.work, ws.pause, conns.closed, sub.closed)
	c.setReady(false)

	c.teardown(conns, sub, ws, held, reason)
	return reason
}

// sessionConns are a session's two connections to the broker: one
// consumes and acks, the other publishes the retry and terminal copies.
type sessionConns struct {
	conn     *amqp.Connection
	node     string             // the broker node conn reached
	closed   <-chan *amqp.Error // conn's close
	pub      *amqp.Connection   // the copies' connection
	blocking *broker.Blocking   // pub's resource alarms
	blocked  prometheus.Gauge   // paysvc_broker_blocked{consumer}
}

// connect dials the consuming connection (a refused login is fatal, and
// ambiguous), notes a change of broker node, dials the copies' connection
// and watches it for resource alarms. On an error it leaves nothing open.
func (c *Consumer) connect() (*sessionConns, error) {
	conn, err := broker.Dial(c.cfg.URL, c.cfg.ConnectionName, c.cfg.TLS)
	if err != nil {
		if broker.LoginRefused(err) {
			return nil, &fatalError{err: err, ambiguous: true}
		}
		return nil, err
	}
	s := &sessionConns{conn: conn, node: conn.RemoteAddr().String()}
	if prev := c.node.Swap(&s.node); prev != nil && *prev != s.node {
		c.m.Failovers.WithLabelValues("broker").Inc()
		c.log.Warn("broker node changed", zap.String("from", *prev), zap.String("broker_node", s.node))
	}
	s.closed = conn.NotifyClose(make(chan *amqp.Error, 1))
	// The retry and terminal copies go out on a connection of their own: in
	// a resource alarm the broker stops reading a connection that
	// publishes, acks included, and the payments that need no copy must
	// still be acked.
	s.pub, err = broker.Dial(c.cfg.URL, c.cfg.ConnectionName+" copies", c.cfg.TLS)
	if err != nil {
		closeWithin(closeTimeout, func() { conn.Close() })
		return nil, err
	}
	// A new connection is not blocked; the gauge is this session's.
	s.blocked = c.m.BrokerBlocked.WithLabelValues("consumer")
	s.blocked.Set(0)
	s.blocking = broker.WatchBlocking(s.pub, func(active bool, reason string) {
		if active {
			c.m.BrokerBlocked.WithLabelValues("consumer").Set(1)
			c.log.Warn("broker blocks publishing (resource alarm): messages that need a retry or terminal copy are held until it clears",
				zap.String("reason", reason))
			return
		}
		c.m.BrokerBlocked.WithLabelValues("consumer").Set(0)
		c.log.Info("broker unblocked publishing", zap.String("reason", reason))
	})
	return s, nil
}

// close stops the alarm watch (before the gauge's reset: a late
// notification sets it no more) and closes both connections, each within
// its bound: blocked, the broker never answers a close.
func (s *sessionConns) close() {
	s.blocking.Stop()
	s.blocked.Set(0)
	broker.CloseConn(s.pub)
	closeWithin(closeTimeout, func() { s.conn.Close() })
}

// subscription is a session's consumer on the main queue.
type subscription struct {
	ch         *amqp.Channel
	closed     <-chan *amqp.Error // ch's close
	tag        string             // the consumer tag
	deliveries <-chan amqp.Delivery
}

// openConsumer declares the topology (on a channel of its own: a refused
// declaration is fatal), then opens the consuming channel with the
// prefetch and consumes the main queue with manual acks.
func (c *Consumer) openConsumer(conn *amqp.Connection) (*subscription, error) {
	setup, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqp channel: %w", err)
	}
	if err := DeclareTopology(setup, Topology{Delays: c.cfg.Retry.Delays,
		MainQueueType: c.cfg.MainQueueType, DeliveryLimit: c.cfg.DeliveryLimit}); err != nil {
		if refused(err) {
			return nil, &fatalError{err: err}
		}
		return nil, err
	}
	setup.Close()

	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqp channel: %w", err)
	}
	sub := &subscription{ch: ch, closed: ch.NotifyClose(make(chan *amqp.Error, 1))}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("amqp qos: %w", err)
	}
	host, _ := os.Hostname()
	sub.tag = fmt.Sprintf("paysvc-%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
	var consumeArgs amqp.Table
	if c.cfg.ConsumerTimeout > 0 {
		consumeArgs = amqp.Table{"x-consumer-timeout": c.cfg.ConsumerTimeout.Milliseconds()}
	}
	sub.deliveries, err = ch.Consume(MainQueue, sub.tag,
		false, // autoAck: ack only after the outcome is durable
		false, // exclusive: competing consumers share the queue
		false, false, consumeArgs)
	if err != nil {
		return nil, fmt.Errorf("amqp consume: %w", err)
	}
	return sub, nil
}

// workers are a session's worker pool: each takes deliveries from work and
// processes them, acking through acks; a worker asks dispatch for a new
// session on pause.
type workers struct {
	work  chan amqp.Delivery
	pause chan error
	acks  *coalescer // the workers' acks, coalesced (ack.go)
	wg    sync.WaitGroup
	// stopProc cancels the workers' handling (procCtx): past the drain
	// timeout.
	stopProc context.CancelFunc
	// endSession lets go of the deliveries held through an outage
	// (sessCtx): once intake has stopped.
	endSession context.CancelFunc
}

// startWorkers starts cfg.Workers workers, each with a publisher of its
// own on the copies' connection.
func (c *Consumer) startWorkers(ctx context.Context, conns *sessionConns, ch *amqp.Channel) *workers {
	ws := &workers{work: make(chan amqp.Delivery), pause: make(chan error, 1)}
	// Workers finish what they started even when ctx is cancelled, until the
	// drain timeout cancels procCtx. A worker holding a message through an
	// outage lets go of it when the session ends (sessCtx).
	procCtx, stopProc := context.WithCancel(context.WithoutCancel(ctx))
	// Not a child of ctx: at shutdown the held workers let go only after
	// the consumer is cancelled (stopIntake).
	sessCtx, endSession := context.WithCancel(context.WithoutCancel(ctx))
	ws.stopProc, ws.endSession = stopProc, endSession
	ws.acks = newCoalescer(ch)
	for range c.cfg.Workers {
		ws.wg.Go(func() {
			cp := copier{pub: broker.NewPublisher(conns.pub, c.cfg.PublishTimeout), blocking: conns.blocking,
				maxBackoff: c.cfg.MaxBackoff, log: c.log}
			defer cp.pub.Close()
			for d := range ws.work {
				d.Acknowledger = ws.acks
				c.process(procCtx, sessCtx, cp, d, ws.pause)
			}
		})
	}
	return ws
}

// end cancels both of the workers' contexts, when the session returns.
func (ws *workers) end() {
	ws.endSession()
	ws.stopProc()
}

// teardown ends a session dispatch has left: stop intake (a dead channel
// sends nothing anyway), then let the workers holding messages through an
// outage go, drain the workers, settle what is left and close the channel.
// held is the delivery dispatch took but never handed over (or 0); reason
// is why the session ended, for the log.
func (c *Consumer) teardown(conns *sessionConns, sub *subscription, ws *workers, held uint64, reason error) {
	start := time.Now()
	cancelled := false // cancel-ok came: the client closes deliveries
	stopIntake(func() {
		if !sub.ch.IsClosed() && !conns.conn.IsClosed() {
			var err error
			cancelled = closeWithin(closeTimeout, func() {
				err = sub.ch.Cancel(sub.tag, false) // noWait=false: wait for cancel-ok
			}) && err == nil
		}
	}, ws.endSession)
	close(ws.work)
	stopped := c.drain(ws)
	c.returnPrefetched(sub, ws.acks, held, stopped && cancelled)
	// A blocked broker may never answer the close: bound the wait (the
	// connections' close is bounded too).
	closeWithin(closeTimeout, func() { sub.ch.Close() })
	c.log.Debug("session torn down", zap.Duration("duration", time.Since(start)), zap.NamedError("error", reason))
}

// drain waits for the workers to return, up to the drain timeout; past it,
// it cancels their handling and waits closeTimeout more. It reports
// whether every worker returned (none holds a delivery).
func (c *Consumer) drain(ws *workers) bool {
	drained := make(chan struct{})
	go func() { ws.wg.Wait(); close(drained) }()
	select {
	case <-drained:
		return true
	case <-time.After(c.cfg.DrainTimeout):
	}
	c.log.Warn("drain timeout: abandoning in-flight messages; the broker will redeliver them",
		zap.Duration("drain_timeout", c.cfg.DrainTimeout))
	ws.stopProc()
	select {
	case <-drained:
	case <-time.After(closeTimeout):
		// A worker stuck in a write to a blocked connection: closing
		// the connection below frees it; nothing it holds was acked.
		c.log.Error("workers did not stop after the drain timeout; closing the connection under them")
	}
	return false
}

// returnPrefetched writes the acks still held before the channel closes
// (bounded: a blocked connection may not take them). Then, if every
// worker has stopped and the consumer's cancel was confirmed (settled),
// the prefetched messages no worker started go back with one nack: on
// RabbitMQ 4.x a nack (multiple) does not count toward a quorum queue's
// delivery limit, where the channel's close would, once for every message
// prefetched at every restart. A message that held a worker past the
// drain timeout is left to the close, and counts. Whatever is left
// unsettled, the channel's close (teardown) returns.
func (c *Consumer) returnPrefetched(sub *subscription, acks *coalescer, held uint64, settled bool) {
	if !closeWithin(closeTimeout, acks.Close) || !settled || sub.ch.IsClosed() {
		return
	}
	var returned int
	var err error
	if closeWithin(closeTimeout, func() {
		if returned, err = returnUnstarted(sub.ch, sub.deliveries, held); err == nil && returned > 0 {
			// A nack the broker refuses closes the channel, later: a
			// round trip tells.
			_, err = sub.ch.QueueDeclarePassive(MainQueue, true, false, false, false, nil)
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
