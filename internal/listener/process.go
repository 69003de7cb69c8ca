package listener

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/timeline"
	"github.com/paysvc/paysvc/internal/tracing"
)

// process takes one delivery to its end, and is the only place that
// acks. It reads as the delivery's story:
//
//   - handleThroughOutages handles it (handle), holding it while a
//     dependency is down and handling it again once the dependency
//     answers: returned to the broker, it would count as a failed delivery
//     on a quorum queue. It lets go of it (nack, requeue) only when sess
//     ends: shutdown or a lost broker session;
//   - route decides its fate: what the broker is told;
//   - settle tells the broker: publishes the copy, acks or nacks;
//   - report logs, counts, records and exports the result.
func (c *Consumer) process(ctx, sess context.Context, cp copier, d amqp.Delivery, pause chan<- error) {
	start := time.Now()
	c.noteEnqueued(d, start)
	retryBack(ctx, c.retries, d, c.log)
	// The message's span: a child of the producer's traceparent, or the
	// root of a new trace. Every log line of the message carries its trace
	// id; every copy paysvc publishes of it carries the span as parent.
	in, traced := tracing.FromHeaders(d.Headers)
	span := c.cfg.Spans.Start(in, traced, MainQueue+" process", tracing.KindConsumer, start)
	log := c.log.With(zap.String("trace_id", span.Context.TraceIDHex()))

	out, letGo := c.handleThroughOutages(ctx, sess, d, span, log)
	// The message's fate (route.go): its result, and the copy to publish.
	a := route(out, d.Headers, c.cfg.Retry, letGo)
	s := c.settle(ctx, sess, cp, d, a, out.orderNo, span.Context, log, pause)
	c.report(ctx, d, out, a, s, span, start, log)
}

// handleThroughOutages handles d until its outcome is not an outage, or
// sess ends while it is held (letGo). While consumption is paused it waits
// before the first try. A duplicate found after a COMMIT of this
// delivery's came back unknown is resolved: applied, if that COMMIT
// applied it.
func (c *Consumer) handleThroughOutages(ctx, sess context.Context, d amqp.Delivery, span tracing.Span, log *zap.Logger) (out outcome, letGo bool) {
	held := broker.Backoff{Max: c.cfg.MaxBackoff}
	unknown := false // a round of this delivery's ended with its COMMIT's outcome unknown
	for {
		if r := c.pausedFor(); r != ReasonNone {
			// Consumption is paused: this message waits with the others
			// instead of trying a dependency that does not take work (a
			// stalled write would hold a connection for the handling
			// bound, and then be killed).
			if !c.hold(sess, &held, r.class(), &depError{r, errPaused}) {
				out, letGo = unhandled(d, r), true
				break
			}
		}
		out = c.handle(ctx, d, span, log)
		unknown = unknown || out.class == ClassCommitUnknown
		if out.kind != Unavailable {
			break
		}
		var down error
		if out.class == ClassMySQLError {
			down = &depError{ReasonMySQLError, out.err}
		} else if down = c.dependencies(ctx); down == nil {
			if out.class != ClassNodeNotReady {
				break // only this message failed: route sends it back alone
			}
			// A Galera node that is not Synced refused it, and the probe
			// reached another (a proxy spreads connections over the
			// nodes): the node, not the message, failed. Held and tried
			// again, it never spends a requeue or an attempt.
			down = &depError{ReasonMySQLNodeNotReady, out.err}
		}
		if !c.hold(sess, &held, out.class, down) {
			letGo = true
			break
		}
	}
	if out.kind == Duplicate && (unknown || ClassCommitUnknown == Class(headerString(d.Headers, HeaderErrorClass))) &&
		c.committedBy(ctx, out.orderNo, span.Context, log) {
		// The COMMIT whose reply was lost (in this delivery's earlier round,
		// or in the copy's that came back alone) applied the payment: this
		// delivery is the one that paid it.
		out.kind, out.resolved = Applied, true
	}
	return out, letGo
}

// settled is what the broker was told about a delivery: the result and
// attempt the log line and the metrics report (a copy that could not be
// published turns the action's into a REQUEUE), and the broker's error.
type settled struct {
	result    Result
	attempt   int
	brokerErr error
}

// settle carries out a: the broker I/O. A copy that is not safely stored
// sends the original back instead, and restarts the session (reconnect,
// redeclare) before more is taken.
func (c *Consumer) settle(ctx, sess context.Context, cp copier, d amqp.Delivery, a action, orderNo string,
	span tracing.Context, log *zap.Logger, pause chan<- error) settled {
	s := settled{result: a.result, attempt: a.attempt}
	switch {
	case a.copy != nil:
		msg := a.copy.publishing(d, time.Now())
		msg.Headers[tracing.Header] = span.String()
		if err := cp.publish(ctx, sess, a.copy.exchange, a.copy.queue, msg, c.m.Held.WithLabelValues("broker")); err != nil {
			s.result, s.attempt, s.brokerErr = ResultRequeue, retryCount(d.Headers), d.Nack(false, true)
			log.Error("copy not published; message requeued", zap.String("order_no", orderNo),
				zap.String("queue", a.copy.queue), zap.Error(err))
			signal(pause, fmt.Errorf("publish: %w", err))
		} else {
			s.brokerErr = d.Ack(false)
			if a.copy.queue == MainQueue {
				c.m.RequeuedAlone.Inc()
			}
			c.retrySent(ctx, orderNo, a.copy, log)
		}
	case a.nack:
		s.brokerErr = d.Nack(false, true)
	default:
		s.brokerErr = d.Ack(false)
	}
	return s
}

// report tells everyone else what became of the delivery: the metrics,
// the trace event (every result but FIRST), the message's span, and the
// "message handled" line (FIRST through the sampled FirstLog), or
// "outcome not acknowledged" when the broker did not take the ack or nack.
func (c *Consumer) report(ctx context.Context, d amqp.Delivery, out outcome, a action, s settled,
	span tracing.Span, start time.Time, log *zap.Logger) {
	fields := []zap.Field{
		zap.String("trace_id", span.Context.TraceIDHex()),
		zap.String("order_no", out.orderNo),
		zap.String("idem_key", out.key),
		zap.String("result", s.result.String()),
		zap.Int("attempt", s.attempt),
		zap.String("error_class", string(out.class)),
		zap.Duration("duration", time.Since(start)),
		zap.Uint64("delivery_tag", d.DeliveryTag),
		zap.Bool("redelivered", d.Redelivered),
	}
	if out.degraded {
		fields = append(fields, zap.Bool("degraded", true))
	}
	if out.resolved {
		fields = append(fields, zap.Bool("commit_resolved", true))
	}
	if a.err != nil && out.kind != Duplicate {
		fields = append(fields, zap.NamedError("error", a.err))
	}
	c.m.Messages.WithLabelValues(s.result.String()).Inc()
	c.m.Duration.Observe(time.Since(start).Seconds())
	if out.class != ClassNone {
		c.m.Errors.WithLabelValues(string(out.class)).Inc()
	}
	if s.result != ResultFirst && out.orderNo != "" && c.cfg.Events != nil {
		c.recordOutcome(ctx, out, a, s, log)
	}
	if span.Recording() {
		span.SetAttributes(attribute.String("messaging.system", "rabbitmq"), attribute.String("messaging.destination.name", MainQueue),
			attribute.String("messaging.operation", "process"), attribute.String("paysvc.order_no", out.orderNo),
			attribute.String("paysvc.result", s.result.String()), attribute.String("paysvc.error_class", string(out.class)))
		span.End(errText(a.err))
	}
	if s.brokerErr != nil {
		// The channel is gone; the broker redelivers and the guards find the
		// outcome.
		fields = append(fields, zap.NamedError("broker_error", s.brokerErr))
		c.log.Warn("outcome not acknowledged", fields...)
		return
	}
	if s.result == ResultFirst {
		c.cfg.FirstLog.Info("message handled", fields...)
		return
	}
	c.log.Info("message handled", fields...)
}

// recordOutcome records the delivery's result in the order's timeline
// (paysvc trace), bounded even when ctx has ended; a failure is logged.
func (c *Consumer) recordOutcome(ctx context.Context, out outcome, a action, s settled, log *zap.Logger) {
	detail := ""
	if a.err != nil && out.kind != Duplicate {
		detail = a.err.Error()
	}
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateWriteTimeout)
	if err := c.cfg.Events.Record(bg, timeline.Event{OrderNo: out.orderNo, Event: s.result.String(),
		ErrorClass: string(out.class), Attempt: s.attempt, Detail: detail}); err != nil {
		log.Warn("could not record the outcome for trace", zap.String("order_no", out.orderNo), zap.Error(err))
	}
	cancel()
}

// retrySent enters a copy published to a wait queue in the retry ledger
// (bounded; a failure is logged: that copy is not watched).
func (c *Consumer) retrySent(ctx context.Context, orderNo string, s *copySpec, log *zap.Logger) {
	w := c.waits[s.queue]
	if w == nil || orderNo == "" {
		return // the terminal queue, or a requeue alone
	}
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateWriteTimeout)
	defer cancel()
	rc := idem.RetryCopy{OrderNo: orderNo, Attempt: s.count, Queue: s.queue,
		OverdueAt: time.Now().Add(w.delay + retryOverdue(w.delay))}
	if err := c.retries.Sent(bg, rc); err != nil {
		log.Warn("retry ledger: could not enter a copy; it is not watched", zap.String("order_no", orderNo),
			zap.String("queue", s.queue), zap.Error(err))
	}
}

// copier publishes a delivery's retry or terminal copy.
type copier struct {
	pub        *broker.Publisher
	blocking   *broker.Blocking // the publisher's connection's resource alarms
	maxBackoff time.Duration
	log        *zap.Logger
}

// publish publishes msg and waits for its confirm. It holds the delivery
// (counted in held) while the broker cannot store the copy, until sess
// ends, rather than send the original back, which would spend one of its
// deliveries on a quorum queue each time round (none on RabbitMQ 4.3+: an
// endless loop), or end the session, which would not help:
//   - while the broker blocks the connection (a resource alarm), until the
//     alarm clears. A copy written as the block began may be stored too
//     once it clears: copies are at least once, and the guards answer the
//     second;
//   - while the broker refuses the copy (nack: the queue at a length limit
//     an operator's policy set, with reject-publish), with backoff.
//
// Any other failure (the connection lost, the copy unroutable: a queue
// deleted, which a new session declares again) is returned at once.
func (cp copier) publish(ctx, sess context.Context, exchange, key string, msg amqp.Publishing, held prometheus.Gauge) error {
	bo := broker.Backoff{Max: cp.maxBackoff}
	for {
		if cp.blocking.Blocked() {
			held.Inc()
			unblocked := cp.blocking.Wait(sess)
			held.Dec()
			if !unblocked {
				return fmt.Errorf("publish to %s/%s: %w", exchange, key, errBrokerBlocked)
			}
		}
		err := cp.pub.Publish(ctx, exchange, key, msg)
		switch {
		case err == nil || ctx.Err() != nil:
			return err
		case cp.blocking.Blocked():
		case errors.Is(err, broker.ErrNacked):
			wait := bo.Next()
			cp.log.Warn("copy refused by the broker; holding the message and trying again",
				zap.String("queue", key), zap.Duration("backoff", wait), zap.Error(err))
			held.Inc()
			slept := broker.Sleep(sess, wait)
			held.Dec()
			if !slept {
				return err
			}
		default:
			return err
		}
	}
}

// errBrokerBlocked: the session ended while the broker blocked publishing.
var errBrokerBlocked = errors.New("the broker blocks publishing (resource alarm)")

// hold keeps a worker (and its delivery) waiting while a dependency does
// not take work (why, a *depError, says which and how): consumption is
// paused (readiness off, paysvc_pause_reason and the log say why, once per
// pause) until a probe passes. It waits with backoff (bo, kept by the
// caller across attempts on the same message: a dependency can answer its
// probe and still fail the real work, a schema problem). Probes are shared
// by every holding worker (dependencies). It returns false when sess ends
// first.
func (c *Consumer) hold(sess context.Context, bo *broker.Backoff, class Class, why error) bool {
	reason := reasonOf(why, class)
	held := c.m.Held.WithLabelValues(reason.dependency())
	held.Inc()
	defer held.Dec()
	if c.paused.Add(1) == 1 {
		c.setPauseReason(reason)
		c.m.Pauses.WithLabelValues(string(class)).Inc()
		c.m.Paused.Set(1)
		c.log.Warn("consumption paused; waiting for the dependency", zap.String("error_class", string(class)),
			zap.String("reason", string(reason)), zap.NamedError("why", why))
	}
	c.updateReady()
	defer func() {
		if c.paused.Add(-1) == 0 {
			c.m.Paused.Set(0)
			c.setPauseReason(ReasonNone)
			c.log.Info("consumption resumed")
		}
		c.updateReady()
	}()
	for {
		if !broker.Sleep(sess, bo.Next()) {
			return false
		}
		err := c.dependencies(sess)
		switch {
		case err == nil:
			return true
		case sess.Err() != nil:
			return false
		}
		if r := reasonOf(err, class); r != c.pausedFor() && c.paused.Load() > 0 {
			c.setPauseReason(r)
			c.log.Warn("consumption still paused, for another reason", zap.String("reason", string(r)), zap.NamedError("why", err))
		}
	}
}

// errPaused: a message taken while consumption was paused waits before it
// is tried.
var errPaused = errors.New("consumption is paused")

// pausedFor is why consumption is paused, or ReasonNone.
func (c *Consumer) pausedFor() Reason {
	if c.paused.Load() == 0 {
		return ReasonNone
	}
	if r := c.pauseReason.Load(); r != nil {
		return *r
	}
	return ReasonNone
}

// PauseReason is why consumption is paused, in words ("" when it is not):
// /readyz shows it.
func (c *Consumer) PauseReason() string { return c.pausedFor().Text() }

// setPauseReason records r as the pause's reason (paysvc_pause_reason: 1
// for r, 0 for the others).
func (c *Consumer) setPauseReason(r Reason) {
	c.pauseReason.Store(&r)
	for _, each := range Reasons {
		v := 0.0
		if each == r {
			v = 1
		}
		c.m.PauseReason.WithLabelValues(string(each)).Set(v)
	}
}

// unhandled is the outcome of a delivery let go while consumption was
// paused, before it was tried: sent back, spending no attempt.
func unhandled(d amqp.Delivery, r Reason) outcome {
	out := outcome{kind: Unavailable, class: r.class(), err: fmt.Errorf("%w: %s", errPaused, r.Text())}
	if p, err := DecodePayment(d.Body); err == nil {
		out.orderNo = p.OrderNo
	}
	return out
}

// committedBy reports whether the payment of orderNo, found applied after
// a COMMIT of this message's came back unknown, was applied by this
// message: its notice carries this message's trace (every copy of a
// message carries its trace). A failed read says no: the payment counts
// as a duplicate, as it did before.
func (c *Consumer) committedBy(ctx context.Context, orderNo string, span tracing.Context, log *zap.Logger) bool {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateWriteTimeout)
	defer cancel()
	tp, err := c.orders.NoticeTrace(rctx, orderNo)
	if err != nil {
		log.Warn("could not read whose commit applied the payment; counted as a duplicate",
			zap.String("order_no", orderNo), zap.Error(err))
		return false
	}
	in, ok := tracing.Parse(tp)
	return ok && in.TraceID == span.TraceID
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
