package listener

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/timeline"
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
	URL            string      // amqp:// or amqps://, with the vhost
	TLS            *tls.Config // for amqps://; nil: the system roots
	ConnectionName string      // shown in the broker's connection list
	Prefetch       int         // unacked messages the broker may send ahead
	Workers        int         // goroutines handling deliveries
	Retry          RetryPolicy // wait queues and the attempt budget
	MainQueueType  string      // classic or quorum
	DeliveryLimit  int         // quorum main queue: deliveries before the terminal queue
	// ConsumerTimeout, if not 0, is the consume's x-consumer-timeout: how
	// long the broker (quorum queues, 3.12+) lets a delivery stay unacked
	// before it takes it back, a delivery count each. Longer than any
	// outage the consumer holds messages through.
	ConsumerTimeout time.Duration
	RedisFallback   Fallback      // CLOSED or OPEN
	HandleTimeout   time.Duration // bound on one message's handling
	DrainTimeout    time.Duration // bound on finishing in-flight messages at shutdown
	PublishTimeout  time.Duration // bound on one retry/terminal publish and its confirm
	MaxBackoff      time.Duration // cap on reconnect and dependency-wait backoff

	Metrics *metrics.Metrics   // nil: an unregistered set
	Events  *timeline.Recorder // nil: outcomes are only logged
	// Spans, if not nil, exports a span per message and one for its
	// database transaction (trace.otlpEndpoint); nil, the trace context
	// still travels.
	Spans *tracing.Tracer
	// FirstLog logs the line of each applied payment (FIRST), which may be
	// sampled (logging.Sampled); nil: the consumer's logger. Every other
	// outcome and every error is logged in full.
	FirstLog *zap.Logger
}

// Payer applies one payment, in its own transaction or in one it shares,
// and returns what order.Store.Pay returns (nil: applied by this call;
// classify reads the rest). An order.Grouper groups the payments that
// arrive together; the order.Store itself pays each alone.
type Payer interface {
	Pay(ctx context.Context, p order.Payment) error
}

// Consumer consumes q.pay.success until its context ends.
type Consumer struct {
	cfg    Config
	orders *order.Store // Check and Ping: what a claim found, whether MySQL answers
	payer  Payer
	guard  *idem.Guard
	log    *zap.Logger
	m      *metrics.Metrics

	ready atomic.Bool
	// paused counts the workers holding a message through an outage.
	paused atomic.Int32
	// lastEnqueued (unix nanos) is LastEnqueued.
	lastEnqueued atomic.Int64
	// waits are the wait queues of cfg.Retry, by name, fixed at New.
	waits map[string]*waitQueue
	// node is the broker node of the current (or last) session.
	node  atomic.Pointer[string]
	probe struct { // the last dependency probe (dependencies)
		sync.Mutex
		at  time.Time
		err error
	}
	// pauseReason is why consumption is paused (a Reason), while it is.
	pauseReason atomic.Pointer[Reason]
	// instance keys the write probe's row: the host name.
	instance string
	// retries is the retry ledger beside the guard's keys.
	retries *idem.Retries
	// redisDownUntil (unix nanos) skips Redis for redisSkip under OPEN after
	// it failed, instead of paying a timeout on every message.
	redisDownUntil atomic.Int64
}

// New returns a Consumer that pays through payer (started and stopped by
// the caller, outliving Run) and asks orders what the guards do not know. A
// nil logger logs nothing.
func New(cfg Config, orders *order.Store, payer Payer, guard *idem.Guard, log *zap.Logger) *Consumer {
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.FirstLog == nil {
		cfg.FirstLog = log
	}
	host, _ := os.Hostname()
	c := &Consumer{cfg: cfg, orders: orders, payer: payer, guard: guard, log: log, m: cfg.Metrics,
		waits: map[string]*waitQueue{}, instance: cmp.Or(host, "paysvc"), retries: guard.Retries()}
	for _, d := range cfg.Retry.Delays {
		c.waits[WaitQueue(d)] = &waitQueue{delay: d}
	}
	c.setPauseReason(ReasonNone) // every reason's series, at 0
	return c
}

// waitQueue is a wait queue's delay and WaitEntered (unix nanos).
type waitQueue struct {
	delay   time.Duration
	entered atomic.Int64
}

// Node returns the address of the broker node the consumer is (or was last)
// connected to; "" before the first session.
func (c *Consumer) Node() string {
	if n := c.node.Load(); n != nil {
		return *n
	}
	return ""
}

// LastEnqueued is when the message this consumer received last entered
// the main queue: its AMQP timestamp (when it was published), or, for a
// retry copy back from a wait queue, when that queue's wait ended (the
// copy keeps the original's timestamp, maybe minutes older), or, with
// neither, when it arrived; zero before the first. The messages still in
// the queue entered it after: their oldest is at most this old.
func (c *Consumer) LastEnqueued() time.Time { return unixNanos(c.lastEnqueued.Load()) }

// WaitEntered is when the retry copy this consumer received last from wait
// queue q was published to it; zero before the first. The copies still in
// q entered it after (one TTL for the whole queue keeps it in order): their
// oldest is at most this old. A queue whose TTL stopped expiring copies
// shows here as an age that grows past its delay.
func (c *Consumer) WaitEntered(q string) time.Time {
	if w := c.waits[q]; w != nil {
		return unixNanos(w.entered.Load())
	}
	return time.Time{}
}

func unixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// noteEnqueued records when d entered the main queue (LastEnqueued) and,
// for a retry copy back from a wait queue, when it entered that one
// (WaitEntered): a copy names its wait queue (x-routed-to) and when it was
// published there (x-last-failed-at); it came back one delay later.
func (c *Consumer) noteEnqueued(d amqp.Delivery, arrived time.Time) {
	enqueued := arrived
	if !d.Timestamp.IsZero() {
		enqueued = d.Timestamp
	}
	q, _ := d.Headers[HeaderRoutedTo].(string)
	failed, _ := d.Headers[HeaderLastFailedAt].(string)
	if w := c.waits[q]; w != nil {
		if t, err := time.Parse(time.RFC3339Nano, failed); err == nil {
			w.entered.Store(t.UnixNano())
			enqueued = t.Add(w.delay)
		}
	}
	c.lastEnqueued.Store(min(enqueued.UnixNano(), arrived.UnixNano()))
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
// An ambiguous one (a login the broker ended without a word, which a cut
// connection looks like too) stops paysvc only when every one of the first
// loginAttempts sessions ends with it.
type fatalError struct {
	err       error
	ambiguous bool
}

// loginAttempts: how many sessions in a row must end with an ambiguous
// refused login before start-up gives up on it.
const loginAttempts = 3

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// Run consumes until ctx is cancelled, then drains in-flight messages and
// returns nil. Lost connections to the broker, Redis or MySQL pause and
// reconnect with capped backoff; Run never gives up on them. It returns an
// error only when the first session fails for a reason reconnecting cannot
// fix, such as a topology that does not match, or when each of the first
// loginAttempts sessions ends with the broker refusing the login.
func (c *Consumer) Run(ctx context.Context) error {
	start := startup{}
	return broker.Reconnect{
		Max:    c.cfg.MaxBackoff,
		Before: c.waitDependencies,
		Stop:   start.stop,
		Ended: func(err error, wait time.Duration) {
			c.m.Reconnects.WithLabelValues("consumer").Inc()
			c.log.Error("amqp session ended; reconnecting", zap.Error(err), zap.Duration("backoff", wait))
		},
	}.Run(ctx, func(ctx context.Context) error {
		defer c.setReady(false)
		return c.session(ctx)
	})
}

// startup follows the sessions until the first that does not end with a
// fatalError: a fatal one among them stops Run.
type startup struct {
	done     bool // a session ended otherwise: fatal errors are retried
	refusals int  // ambiguous refused logins in a row so far
}

// stop returns the error Run stops with after a session that ended with
// err, or nil to reconnect.
func (s *startup) stop(err error) error {
	var fatal *fatalError
	if s.done || !errors.As(err, &fatal) {
		s.done = true
		return nil
	}
	if !fatal.ambiguous {
		return err
	}
	if s.refusals++; s.refusals == loginAttempts {
		return fmt.Errorf("%w (%d times in a row: check amqp.url's user, password and vhost)", err, s.refusals)
	}
	return nil
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

// dependenciesUp reports whether every dependency takes work (dependencies).
func (c *Consumer) dependenciesUp(ctx context.Context) bool { return c.dependencies(ctx) == nil }

// dependencies probes MySQL, and Redis under CLOSED, as a session start
// does, and returns why one does not take work (a *depError), or nil. One
// probe runs at a time, and its answer serves every caller for
// probeShared: a burst of failures, and every worker holding a message
// through an outage, probe once.
func (c *Consumer) dependencies(ctx context.Context) error {
	c.probe.Lock()
	defer c.probe.Unlock()
	if time.Since(c.probe.at) < probeShared {
		return c.probe.err
	}
	c.probe.err = c.probeDependencies(ctx)
	c.probe.at = time.Now()
	return c.probe.err
}

// probeDependencies returns nil once MySQL answers and commits a write, and
// Redis answers too under CLOSED; else a *depError saying which does not.
// The write probe matters where MySQL answers reads but stalls writes (a
// global read lock, a metadata lock, a full disk, a semi-synchronous
// wait): payments time out one by one while a read says all is well. On a
// Galera node the pool gives the probe a connection only to a Synced node
// (sqldb): a node that is not (a donor, a joiner, one cut off from the
// primary component) fails the probe with mysql_node_not_ready.
func (c *Consumer) probeDependencies(ctx context.Context) error {
	ping := func(f func(context.Context) error) error {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		return f(pctx)
	}
	if err := ping(c.orders.Ping); err != nil {
		switch {
		case errors.Is(err, order.ErrReadOnly):
			return &depError{ReasonMySQLReadOnly, err}
		case sqldb.IsNodeNotReady(err):
			return &depError{ReasonMySQLNodeNotReady, err}
		}
		return &depError{ReasonMySQLUnavailable, err}
	}
	err := ping(func(ctx context.Context) error { return c.orders.ProbeWrites(ctx, c.instance) })
	if sqldb.IsDeadlock(err) {
		// The probe's write reached the server and lost to another's
		// (two processes of one host, whose probes share a row, probing
		// through two Galera nodes): the server takes writes.
		err = nil
	}
	if err != nil {
		// A Galera node that is not Synced (a donor under its global read
		// lock, a joiner) explains a write that does not commit: name it,
		// not the symptom. A pooled connection's last look at the node
		// can be up to a second old.
		if nerr := ping(c.orders.NodeReady); sqldb.IsNodeNotReady(nerr) {
			return &depError{ReasonMySQLNodeNotReady, nerr}
		}
		switch {
		case errors.Is(err, order.ErrWritesStalled):
			return &depError{ReasonMySQLWritesStalled, err}
		case sqldb.IsSchemaOrPermission(err):
			return &depError{ReasonMySQLError, err}
		case sqldb.IsNodeNotReady(err):
			return &depError{ReasonMySQLNodeNotReady, err}
		}
		return &depError{ReasonMySQLUnavailable, err}
	}
	if c.cfg.RedisFallback == FallbackClosed {
		if err := ping(c.guard.Probe); err != nil {
			return &depError{ReasonRedisUnavailable, err}
		}
	}
	return nil
}

// probeTimeout bounds each dependency probe: the read, the write's commit,
// the Redis round trip. A write that commits in a healthy database takes
// milliseconds; one held past this is a stall.
const probeTimeout = 3 * time.Second

// probeShared is how long a probe's answer serves other callers.
const probeShared = time.Second

// Reason says why consumption is paused: paysvc_pause_reason{reason} and
// /readyz name it.
type Reason string

// The reasons for a pause.
const (
	ReasonNone               Reason = ""
	ReasonMySQLUnavailable   Reason = "mysql_unavailable"
	ReasonMySQLReadOnly      Reason = "mysql_read_only"
	ReasonMySQLWritesStalled Reason = "mysql_writes_stalled"
	ReasonMySQLError         Reason = "mysql_error"
	ReasonMySQLNodeNotReady  Reason = "mysql_node_not_ready"
	ReasonRedisUnavailable   Reason = "redis_unavailable"
)

// Reasons lists every pause reason, for the metric's series.
var Reasons = []Reason{ReasonMySQLUnavailable, ReasonMySQLReadOnly, ReasonMySQLWritesStalled,
	ReasonMySQLError, ReasonMySQLNodeNotReady, ReasonRedisUnavailable}

// Text is the reason in words, for /readyz and the logs.
func (r Reason) Text() string {
	switch r {
	case ReasonMySQLUnavailable:
		return "MySQL does not answer"
	case ReasonMySQLReadOnly:
		return "MySQL is read-only"
	case ReasonMySQLWritesStalled:
		return "MySQL does not commit writes"
	case ReasonMySQLError:
		return "MySQL refuses paysvc's statements (a missing table or column, a revoked grant)"
	case ReasonMySQLNodeNotReady:
		return "the Galera node is not Synced"
	case ReasonRedisUnavailable:
		return "Redis does not answer"
	}
	return string(r)
}

// class is the error class a pause for r shows, for a message held before
// it was tried.
func (r Reason) class() Class {
	switch r {
	case ReasonRedisUnavailable:
		return ClassRedisUnavailable
	case ReasonMySQLError:
		return ClassMySQLError
	case ReasonMySQLWritesStalled:
		return ClassTimeout
	case ReasonMySQLNodeNotReady:
		return ClassNodeNotReady
	}
	return ClassMySQLUnavailable
}

// dependency names the server r is about, for paysvc_held_messages.
func (r Reason) dependency() string {
	if r == ReasonRedisUnavailable {
		return "redis"
	}
	return "mysql"
}

// depError is why a dependency does not take work.
type depError struct {
	reason Reason
	err    error
}

func (e *depError) Error() string { return e.reason.Text() + ": " + e.err.Error() }
func (e *depError) Unwrap() error { return e.err }

// reasonOf is the pause reason an error of a probe (or of handling) shows.
func reasonOf(err error, class Class) Reason {
	var de *depError
	if errors.As(err, &de) {
		return de.reason
	}
	switch class {
	case ClassRedisUnavailable:
		return ReasonRedisUnavailable
	case ClassMySQLError:
		return ReasonMySQLError
	case ClassNodeNotReady:
		return ReasonMySQLNodeNotReady
	}
	return ReasonMySQLUnavailable
}
