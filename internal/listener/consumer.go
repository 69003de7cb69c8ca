package listener

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/fault"
	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/trace"
	"github.com/paysvc/paysvc/internal/tracing"
)

// Fallback says what happens to messages while Redis cannot be reached.
type Fallback string

const (
	// FallbackClosed stops taking messages until Redis answers again; they
	// wait in the broker and spend no retry attempt.
	FallbackClosed Fallback = "CLOSED"
	// FallbackOpen goes on with the database guards alone.
	FallbackOpen Fallback = "OPEN"
)

// Config is what the consumer needs to know.
type Config struct {
	URL            string        // amqp:// or amqps://, with the vhost
	TLS            *tls.Config   // for amqps://; nil: the system roots
	ConnectionName string        // shown in the broker's connection list
	Prefetch       int           // unacked messages the broker may send ahead
	Workers        int           // goroutines handling deliveries
	Retry          RetryPolicy   // wait queues and the attempt budget
	MainQueueType  string        // classic or quorum
	DeliveryLimit  int           // quorum main queue: deliveries before the terminal queue
	RedisFallback  Fallback      // CLOSED or OPEN
	HandleTimeout  time.Duration // bound on one message's handling
	DrainTimeout   time.Duration // bound on finishing in-flight messages at shutdown
	PublishTimeout time.Duration // bound on one retry/terminal publish and its confirm
	MaxBackoff     time.Duration // cap on reconnect and dependency-wait backoff
	GroupSize      int           // payments per transaction at most (order.Grouper); 1: one each
	GroupConns     int           // payment transactions running at once when grouping

	Metrics *metrics.Metrics // nil: an unregistered set
	Events  *trace.Recorder  // nil: outcomes are only logged
	// Spans, if not nil, exports a span per message and one for its
	// database transaction (trace.otlpEndpoint).
	Spans *tracing.Exporter
	// FirstLog logs the line of each applied payment (FIRST), which may be
	// sampled (logging.Sampled); nil: the consumer's logger. Every other
	// outcome and every error is logged in full.
	FirstLog *zap.Logger
}

// Consumer consumes q.pay.success until its context ends.
type Consumer struct {
	cfg    Config
	orders *order.Store
	guard  *idem.Guard
	log    *zap.Logger
	m      *metrics.Metrics

	payer *order.Grouper // made by Run
	ready atomic.Bool
	// paused counts the workers holding a message through an outage.
	paused atomic.Int32
	// lastEnqueued (unix nanos) is LastEnqueued.
	lastEnqueued atomic.Int64
	// node is the broker node of the current (or last) session.
	node  atomic.Pointer[string]
	probe struct { // the last dependency probe (dependenciesUp)
		sync.Mutex
		at time.Time
		up bool
	}
	// redisDownUntil (unix nanos) skips Redis for a while under OPEN after
	// it failed, instead of paying a timeout on every message.
	redisDownUntil atomic.Int64
}

// New returns a Consumer. A nil logger logs nothing.
func New(cfg Config, orders *order.Store, guard *idem.Guard, log *zap.Logger) *Consumer {
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.FirstLog == nil {
		cfg.FirstLog = log
	}
	return &Consumer{cfg: cfg, orders: orders, guard: guard, log: log, m: cfg.Metrics}
}

// Node returns the address of the broker node the consumer is (or was last)
// connected to; "" before the first session.
func (c *Consumer) Node() string {
	if n := c.node.Load(); n != nil {
		return *n
	}
	return ""
}

// LastEnqueued is when the message this consumer received last was
// published (its AMQP timestamp), or, without one, when it arrived; zero
// before the first.
func (c *Consumer) LastEnqueued() time.Time {
	if n := c.lastEnqueued.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Ready reports whether the consumer is consuming: a session is up and no
// worker is holding a message through an outage.
func (c *Consumer) Ready() bool { return c.ready.Load() && c.paused.Load() == 0 }

func (c *Consumer) setReady(ok bool) {
	c.ready.Store(ok)
	c.updateReady()
}

func (c *Consumer) updateReady() {
	if c.Ready() {
		c.m.Ready.Set(1)
	} else {
		c.m.Ready.Set(0)
	}
}

// refused reports a broker answer that reconnecting cannot change: a
// topology that does not match (406), or access refused (403, 530).
func refused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) &&
		(ae.Code == amqp.PreconditionFailed || ae.Code == amqp.AccessRefused || ae.Code == amqp.NotAllowed)
}

// fatalError is a problem reconnecting cannot fix (a topology mismatch, a
// refused login); at start-up it stops paysvc, later it is logged and retried.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// Run consumes until ctx is cancelled, then drains in-flight messages and
// returns nil. Lost connections to the broker, Redis or MySQL pause and
// reconnect with capped backoff; Run never gives up on them. It returns an
// error only when the first session fails for a reason reconnecting cannot
// fix, such as a topology that does not match.
func (c *Consumer) Run(ctx context.Context) error {
	// With GroupSize 1 (or 0) the grouper pays each payment alone. A worker
	// still running after a session gave up on it pays alone after Stop.
	c.payer = c.orders.NewGrouper(c.cfg.GroupSize, c.cfg.GroupConns,
		func(n int) { c.m.GroupSize.Observe(float64(n)) })
	defer c.payer.Stop()
	bo := broker.Backoff{Max: c.cfg.MaxBackoff}
	first := true
	for {
		if err := c.waitDependencies(ctx, &bo); err != nil {
			return nil // ctx is done
		}
		started := time.Now()
		err := c.session(ctx)
		c.setReady(false)
		if ctx.Err() != nil {
			return nil
		}
		var fatal *fatalError
		if first && errors.As(err, &fatal) {
			return err
		}
		first = false
		c.m.Reconnects.WithLabelValues("consumer").Inc()
		if time.Since(started) > time.Minute {
			bo.Reset()
		}
		wait := bo.Next()
		c.log.Error("amqp session ended; reconnecting", zap.Error(err), zap.Duration("backoff", wait))
		if !broker.Sleep(ctx, wait) {
			return nil
		}
	}
}

// waitDependencies returns once MySQL answers, and Redis too under CLOSED.
func (c *Consumer) waitDependencies(ctx context.Context, bo *broker.Backoff) error {
	for {
		err := c.probeDependencies(ctx)
		if err == nil {
			return nil
		}
		wait := bo.Next()
		c.log.Warn("dependency unavailable; not consuming", zap.Error(err), zap.Duration("backoff", wait))
		if !broker.Sleep(ctx, wait) {
			return ctx.Err()
		}
	}
}

// session runs one connection: declare, consume, dispatch to workers, and on
// the way out cancel the consumer, drain the workers and close. It returns
// why it ended (nil when ctx was cancelled).
func (c *Consumer) session(ctx context.Context) error {
	host, _ := os.Hostname()
	conn, err := broker.Dial(c.cfg.URL, c.cfg.ConnectionName, c.cfg.TLS)
	if err != nil {
		if errors.Is(err, amqp.ErrCredentials) {
			return &fatalError{err}
		}
		return err
	}
	defer closeWithin(5*time.Second, func() { conn.Close() })
	node := conn.RemoteAddr().String()
	if prev := c.node.Swap(&node); prev != nil && *prev != node {
		c.m.Failovers.WithLabelValues("broker").Inc()
		c.log.Warn("broker node changed", zap.String("from", *prev), zap.String("broker_node", node))
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		for b := range blocked {
			// A resource alarm: publishes (and acks on this connection) stall
			// until it clears. Nothing is lost; say so.
			c.log.Warn("broker blocked this connection", zap.Bool("active", b.Active), zap.String("reason", b.Reason))
		}
	}()

	setup, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp channel: %w", err)
	}
	if err := DeclareTopology(setup, Topology{Delays: c.cfg.Retry.Delays,
		MainQueueType: c.cfg.MainQueueType, DeliveryLimit: c.cfg.DeliveryLimit}); err != nil {
		if refused(err) {
			return &fatalError{err}
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
	deliveries, err := ch.Consume(MainQueue, tag,
		false, // autoAck: ack only after the outcome is durable
		false, // exclusive: competing consumers share the queue
		false, false, nil)
	if err != nil {
		return fmt.Errorf("amqp consume: %w", err)
	}

	// Workers finish what they started even when ctx is cancelled, until the
	// drain timeout cancels procCtx. A worker holding a message through an
	// outage lets go of it when the session ends (sessCtx).
	procCtx, stopProc := context.WithCancel(context.WithoutCancel(ctx))
	defer stopProc()
	sessCtx, endSession := context.WithCancel(ctx)
	defer endSession()
	work := make(chan amqp.Delivery)
	pause := make(chan error, 1)
	acks := newCoalescer(ch) // the workers' acks, coalesced (ack.go)
	var wg sync.WaitGroup
	for range c.cfg.Workers {
		wg.Go(func() {
			pub := broker.NewPublisher(conn, c.cfg.PublishTimeout)
			defer pub.Close()
			for d := range work {
				d.Acknowledger = acks
				c.process(procCtx, sessCtx, pub, d, pause)
			}
		})
	}
	c.setReady(true)
	c.log.Info("consuming", zap.String("queue", MainQueue), zap.String("broker_node", node), zap.String("consumer_tag", tag),
		zap.Int("prefetch", c.cfg.Prefetch), zap.Int("workers", c.cfg.Workers))

	reason := dispatch(ctx, deliveries, work, pause, connClosed, chClosed)
	endSession()
	c.setReady(false)

	// Stop intake first, so the broker sends nothing more (a dead channel
	// sends nothing anyway).
	teardown := time.Now()
	if !ch.IsClosed() && !conn.IsClosed() {
		closeWithin(5*time.Second, func() {
			ch.Cancel(tag, false) // noWait=false: wait for cancel-ok
		})
	}
	close(work)
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(c.cfg.DrainTimeout):
		c.log.Warn("drain timeout: abandoning in-flight messages; the broker will redeliver them",
			zap.Duration("drain_timeout", c.cfg.DrainTimeout))
		stopProc()
		select {
		case <-drained:
		case <-time.After(5 * time.Second):
			// A worker stuck in a write to a blocked connection: closing
			// the connection below frees it; nothing it holds was acked.
			c.log.Error("workers did not stop after the drain timeout; closing the connection under them")
		}
	}
	// The acks still held go out before the channel closes (bounded: a
	// blocked connection may not take them). Prefetched messages no worker
	// started are still unacked: closing the channel puts them back on the
	// queue. A blocked broker may never answer the close: bound the wait
	// (the deferred conn.Close is bounded too).
	closeWithin(5*time.Second, acks.Close)
	closeWithin(5*time.Second, func() { ch.Close() })
	c.log.Debug("session torn down", zap.Duration("duration", time.Since(teardown)), zap.NamedError("error", reason))
	return reason
}

// closeWithin runs f, waiting for it at most d.
func closeWithin(d time.Duration, f func()) {
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// dispatch hands deliveries to workers until ctx ends, a worker asks for a
// pause, or the connection, channel or delivery stream ends. A delivery
// taken but not handed over stays unacked and goes back to the queue when
// the channel closes.
func dispatch(ctx context.Context, deliveries <-chan amqp.Delivery, work chan<- amqp.Delivery,
	pause <-chan error, connClosed, chClosed <-chan *amqp.Error) error {
	closedErr := func(what string, e *amqp.Error) error {
		if e == nil {
			return fmt.Errorf("amqp %s closed", what)
		}
		return fmt.Errorf("amqp %s closed: %w", what, e)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-pause:
			return err
		case e := <-connClosed:
			return closedErr("connection", e)
		case e := <-chClosed:
			return closedErr("channel", e)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("amqp deliveries closed: consumer cancelled")
			}
			select {
			case work <- d:
			case <-ctx.Done():
				return nil
			case err := <-pause:
				return err
			case e := <-connClosed:
				return closedErr("connection", e)
			case e := <-chClosed:
				return closedErr("channel", e)
			}
		}
	}
}

// outcome is what handling decided for one delivery.
type outcome struct {
	kind     Kind
	class    Class
	err      error
	orderNo  string
	key      string
	degraded bool          // handled without the Redis guard (OPEN)
	wait     time.Duration // in_flight: the other holder's remaining lease
	released bool          // the in-flight claim was deleted
}

// process handles one delivery and tells the broker. It is the only place
// that acks. While a dependency is down it holds the delivery and handles it
// again once the dependency answers: returned to the broker, it would count
// as a failed delivery on a quorum queue. It lets go of it (nack, requeue)
// only when sess ends: shutdown or a lost broker session.
func (c *Consumer) process(ctx, sess context.Context, pub *broker.Publisher, d amqp.Delivery, pause chan<- error) {
	start := time.Now()
	if d.Timestamp.IsZero() {
		c.lastEnqueued.Store(start.UnixNano())
	} else {
		c.lastEnqueued.Store(d.Timestamp.UnixNano())
	}
	// The message's span: a child of the producer's traceparent, or the
	// root of a new trace. Every log line of the message carries its trace
	// id; every copy paysvc publishes of it carries the span as parent.
	in, traced := tracing.FromHeaders(d.Headers)
	if !traced {
		in = tracing.New()
	}
	span := in.Child()
	traceID := zap.String("trace_id", span.TraceIDHex())
	log := c.log.With(traceID)
	var out outcome
	held := broker.Backoff{Max: c.cfg.MaxBackoff}
	letGo := false // held through an outage until the session ended
	for {
		out = c.handle(ctx, d, span, log)
		if out.kind != Unavailable || fault.Mutated("park_unavailable") ||
			(out.class != ClassMySQLError && c.dependenciesUp(ctx)) {
			break
		}
		if !c.hold(sess, &held, out.class) {
			letGo = true
			break
		}
	}
	count := retryCount(d.Headers)
	var result string
	var brokerErr error
	// send publishes a copy of d to queue and acks d; a copy that is not
	// safely stored sends the original back instead, and restarts the
	// session (reconnect, redeclare) before more is taken.
	send := func(exchange, queue string, msg amqp.Publishing, ok string) {
		msg.Headers[tracing.Header] = span.String()
		if err := pub.Publish(ctx, exchange, queue, msg); err != nil {
			result, brokerErr = "REQUEUE", d.Nack(false, true)
			log.Error("copy not published; message requeued", zap.String("order_no", out.orderNo),
				zap.String("queue", queue), zap.Error(err))
			signal(pause, fmt.Errorf("publish: %w", err))
			return
		}
		result, brokerErr = ok, d.Ack(false)
	}
	kind := out.kind
	if fault.Mutated("park_unavailable") && kind == Unavailable {
		kind = Terminal // a deliberately broken build: outages dead-letter payable payments
	}
	if kind == Unavailable && !letGo {
		// Every dependency answers: only this message failed (a statement
		// that timed out, a COMMIT whose reply was lost). It goes back alone
		// while the others flow; past maxRequeuesAlone it spends an attempt.
		kind = requeueAlone
		if n := headerCount(d.Headers, HeaderRequeueCount); n >= maxRequeuesAlone {
			kind = Retryable
			out.err = fmt.Errorf("requeued %d times without an attempt: %w", n, out.err)
		}
	}
	switch kind {
	case requeueAlone:
		msg := failedCopy(d, MainQueue, count, out.class, out.err, time.Now())
		msg.Headers[HeaderRequeueCount] = int32(headerCount(d.Headers, HeaderRequeueCount) + 1)
		send(RetryExchange, MainQueue, msg, "REQUEUE")
		c.m.RequeuedAlone.Inc()
	case Applied:
		result, brokerErr = "FIRST", d.Ack(false)
	case Duplicate:
		result, brokerErr = "DUPLICATE", d.Ack(false)
	case Retryable, Terminal:
		queue, n := c.cfg.Retry.next(kind, count)
		inflight := headerCount(d.Headers, HeaderInFlightCount)
		if out.class == ClassInFlight {
			if q, ok := c.cfg.Retry.inFlight(inflight, out.wait); ok {
				queue, n, inflight = q, count, inflight+1
			}
		}
		cause := out.err
		if kind == Retryable && queue == TerminalQueue {
			cause = fmt.Errorf("gave up after %d retries: %w", count, out.err)
		}
		msg := failedCopy(d, queue, n, out.class, cause, time.Now())
		if inflight > 0 {
			msg.Headers[HeaderInFlightCount] = int32(inflight)
		}
		ok := "TERMINAL"
		if queue != TerminalQueue {
			ok = "RETRY"
		}
		send(DLXExchange, queue, msg, ok)
		if result == ok {
			count = n
		}
	case Unavailable:
		// Held through an outage until the session ended: back to the queue,
		// spending no attempt.
		result, brokerErr = "REQUEUE", d.Nack(false, true)
	}
	fields := []zap.Field{
		traceID,
		zap.String("order_no", out.orderNo),
		zap.String("idem_key", out.key),
		zap.String("result", result),
		zap.Int("attempt", count),
		zap.String("error_class", string(out.class)),
		zap.Duration("duration", time.Since(start)),
		zap.Uint64("delivery_tag", d.DeliveryTag),
		zap.Bool("redelivered", d.Redelivered),
	}
	if out.degraded {
		fields = append(fields, zap.Bool("degraded", true))
	}
	if out.err != nil && out.kind != Duplicate {
		fields = append(fields, zap.NamedError("error", out.err))
	}
	c.m.Messages.WithLabelValues(result).Inc()
	c.m.Duration.Observe(time.Since(start).Seconds())
	if out.class != ClassNone {
		c.m.Errors.WithLabelValues(string(out.class)).Inc()
	}
	if result != "FIRST" && out.orderNo != "" && c.cfg.Events != nil {
		detail := ""
		if out.err != nil && out.kind != Duplicate {
			detail = out.err.Error()
		}
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if err := c.cfg.Events.Record(bg, trace.Event{OrderNo: out.orderNo, Event: result,
			ErrorClass: string(out.class), Attempt: count, Detail: detail}); err != nil {
			log.Warn("could not record the outcome for trace", zap.String("order_no", out.orderNo), zap.Error(err))
		}
		cancel()
	}
	if c.cfg.Spans != nil {
		c.cfg.Spans.Export(tracing.Span{Context: span, Parent: parentOf(in, traced), Name: MainQueue + " process", Kind: tracing.KindConsumer,
			Start: start, End: time.Now(), Err: errText(out.err), Attrs: map[string]string{
				"messaging.system": "rabbitmq", "messaging.destination.name": MainQueue, "messaging.operation": "process",
				"paysvc.order_no": out.orderNo, "paysvc.result": result, "paysvc.error_class": string(out.class)}})
	}
	if brokerErr != nil {
		// The channel is gone; the broker redelivers and the guards find the
		// outcome.
		fields = append(fields, zap.NamedError("broker_error", brokerErr))
		c.log.Warn("outcome not acknowledged", fields...)
		return
	}
	if result == "FIRST" {
		c.cfg.FirstLog.Info("message handled", fields...)
		return
	}
	c.log.Info("message handled", fields...)
}

// hold keeps a worker (and its delivery) waiting while a dependency is
// down: consumption is paused (readiness off, logged once per pause) until
// a probe passes. It waits with backoff (bo, kept by the caller across
// attempts on the same message: a dependency can answer its probe and
// still fail the real work, a read-only failover or a schema problem). It
// returns false when sess ends first.
func (c *Consumer) hold(sess context.Context, bo *broker.Backoff, class Class) bool {
	held := c.m.Held.WithLabelValues(class.dependency())
	held.Inc()
	defer held.Dec()
	if c.paused.Add(1) == 1 {
		if fault.Mutated("exit_on_pause") {
			os.Exit(3) // a deliberately broken build: crashes on an outage
		}
		c.m.Pauses.WithLabelValues(string(class)).Inc()
		c.m.Paused.Set(1)
		c.log.Warn("consumption paused; waiting for the dependency", zap.String("error_class", string(class)))
	}
	c.updateReady()
	defer func() {
		if c.paused.Add(-1) == 0 {
			c.m.Paused.Set(0)
			c.log.Info("consumption resumed")
		}
		c.updateReady()
	}()
	for {
		if !broker.Sleep(sess, bo.Next()) {
			return false
		}
		if err := c.probeDependencies(sess); err == nil {
			return true
		} else if sess.Err() != nil {
			return false
		}
	}
}

// dependenciesUp probes MySQL, and Redis under CLOSED, as a session start
// does; answers are shared for a second, so that a burst of failures probes
// once.
func (c *Consumer) dependenciesUp(ctx context.Context) bool {
	c.probe.Lock()
	defer c.probe.Unlock()
	if time.Since(c.probe.at) < time.Second {
		return c.probe.up
	}
	c.probe.up = c.probeDependencies(ctx) == nil
	c.probe.at = time.Now()
	return c.probe.up
}

// probeDependencies returns nil once MySQL answers, and Redis too under CLOSED.
func (c *Consumer) probeDependencies(ctx context.Context) error {
	ping := func(name string, f func(context.Context) error) error {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		if err := f(pctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	err := ping("mysql", c.orders.Ping)
	if err == nil && c.cfg.RedisFallback == FallbackClosed {
		err = ping("redis", c.guard.Probe)
	}
	return err
}

// probeTimeout bounds one dependency probe.
const probeTimeout = 3 * time.Second

// requeueAlone is process's own routing of an Unavailable outcome while the
// dependencies answer: a copy back to the main queue, no attempt spent.
const requeueAlone Kind = -1

func signal(pause chan<- error, err error) {
	select {
	case pause <- err:
	default:
	}
}

// handle decides one delivery: decode, claim, pay, mark. A panic becomes a
// terminal outcome.
func (c *Consumer) handle(ctx context.Context, d amqp.Delivery, span tracing.Context, log *zap.Logger) (out outcome) {
	var claim idem.Claim
	held := false // a claim this call must still mark done or release
	defer func() {
		if r := recover(); r != nil {
			log.Error("panic while handling", zap.String("order_no", out.orderNo),
				zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			out.kind, out.class, out.err = Terminal, ClassPanic, fmt.Errorf("%w: %v", errPanic, r)
			if held {
				out.released = c.release(ctx, out.orderNo, claim, "panic", log)
			}
		}
	}()
	p, err := DecodePayment(d.Body)
	if err != nil {
		out.kind, out.class = classify(err)
		out.err = err
		return out
	}
	out.orderNo, out.key = p.OrderNo, c.guard.Key(p.OrderNo)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.HandleTimeout)
	defer cancel()

	settle := func(err error) outcome {
		out.err = err
		out.kind, out.class = classify(err)
		return out
	}

	var st idem.State
	var degraded bool
	st, claim, degraded, err = c.claim(ctx, p.OrderNo, log)
	if err != nil {
		return settle(err)
	}
	out.degraded = degraded
	held = st == idem.Claimed
	fault.Point("after_claim")

	if st == idem.Done || st == idem.InFlight {
		// Redis alone never drops a message: the database decides.
		switch err := c.orders.Check(ctx, p); {
		case err != nil:
			return settle(err) // already paid → duplicate; or why not
		case st == idem.InFlight:
			out.wait = claim.Remaining
			return settle(fmt.Errorf("order %s: %w (lease %s left)", p.OrderNo, errInFlight, claim.Remaining.Round(time.Millisecond)))
		default:
			c.m.Disagreements.WithLabelValues("redis_done_db_unpaid").Inc()
			log.Warn("redis and database disagree: key says done, order is not paid; applying",
				zap.String("order_no", p.OrderNo), zap.String("idem_key", out.key))
		}
	}

	// The database transaction is a child span of the message's; the
	// notice it writes carries it as its parent.
	db := span.Child()
	p.Trace = db.String()
	payStart := time.Now()
	err = c.payer.Pay(ctx, p)
	if c.cfg.Spans != nil {
		c.cfg.Spans.Export(tracing.Span{Context: db, Parent: span.SpanID, Name: "paysvc pay", Kind: tracing.KindClient,
			Start: payStart, End: time.Now(), Attrs: map[string]string{"db.system": "mysql", "paysvc.order_no": p.OrderNo},
			Err: errText(err)})
	}
	kind, _ := classify(err)
	if err == nil {
		fault.Point("after_commit")
	}
	bg, cancelBg := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancelBg()
	switch {
	case !held:
	case kind == Applied || kind == Duplicate:
		if kind == Duplicate {
			// Redis let the message through as new; the database had it.
			c.m.Disagreements.WithLabelValues("redis_new_db_applied").Inc()
			log.Info("redis and database disagree: key was new, the database had the payment",
				zap.String("order_no", p.OrderNo), zap.String("idem_key", out.key))
		}
		if err := c.guard.Done(bg, p.OrderNo); err != nil {
			log.Warn("could not mark the key done; its lease will expire and the database stays the guard",
				zap.String("order_no", p.OrderNo), zap.Error(err))
		}
	default:
		out.released = c.release(ctx, p.OrderNo, claim, "failure", log)
	}
	held = false
	return settle(err)
}

// claim takes the order's Redis key. Under CLOSED, Redis trouble is an
// errRedisUnavailable; under OPEN it is a degraded claim (the database guards
// alone), and Redis is skipped for a few seconds.
func (c *Consumer) claim(ctx context.Context, orderNo string, log *zap.Logger) (idem.State, idem.Claim, bool, error) {
	open := c.cfg.RedisFallback == FallbackOpen
	if open && time.Now().UnixNano() < c.redisDownUntil.Load() {
		c.m.Degraded.Set(1)
		log.Warn("redis guard skipped: degraded (idempotent.redisFallback=OPEN)", zap.String("order_no", orderNo))
		return 0, idem.Claim{}, true, nil
	}
	st, claim, err := c.guard.Claim(ctx, orderNo)
	if err == nil {
		c.m.Degraded.Set(0)
		return st, claim, false, nil
	}
	// The SET may have landed before the reply was lost: free it if we can.
	c.release(ctx, orderNo, claim, "claim error", log)
	if !open {
		return 0, claim, false, fmt.Errorf("%w: %w", errRedisUnavailable, err)
	}
	c.redisDownUntil.Store(time.Now().Add(5 * time.Second).UnixNano())
	c.m.Degraded.Set(1)
	log.Warn("redis unavailable: going on with the database guards alone (idempotent.redisFallback=OPEN)",
		zap.String("order_no", orderNo), zap.Error(err))
	return 0, claim, true, nil
}

// release deletes the claim if it still holds its token, even when ctx is
// done (but within 2 s), logs it, and reports whether a key was deleted.
func (c *Consumer) release(ctx context.Context, orderNo string, claim idem.Claim, after string, log *zap.Logger) bool {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	released, err := c.guard.Release(bg, claim)
	log.Info("idem key released", zap.String("order_no", orderNo), zap.String("idem_key", claim.Key),
		zap.Bool("deleted", released), zap.NamedError("release_error", err), zap.String("after", after))
	return released
}

// parentOf is the parent span id of a message's span: the producer's span,
// or none when the message came without a trace.
func parentOf(in tracing.Context, traced bool) [8]byte {
	if !traced {
		return [8]byte{}
	}
	return in.SpanID
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
