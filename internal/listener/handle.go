package listener

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/fault"
	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/tracing"
)

// outcome is what handling decided for one delivery.
type outcome struct {
	kind     Kind
	class    Class
	err      error
	orderNo  string
	key      string
	degraded bool          // handled without the Redis guard (OPEN)
	wait     time.Duration // in_flight: the other holder's remaining lease
	// resolved: applied by a COMMIT of this message's whose reply was lost
	// (found applied, and by this message, on a later round).
	resolved bool
}

// lateWriteTimeout bounds a write that must happen even when the message's
// context has ended: the done mark, the release of a claim, the trace event
// of the outcome.
const lateWriteTimeout = 2 * time.Second

// redisSkip is how long the consumer goes on without Redis under OPEN after
// Redis failed, instead of paying a timeout on every message.
const redisSkip = 5 * time.Second

// handle decides one delivery: decode, claim the order's Redis key, check
// what the claim found against the database, pay, and finish the claim
// (mark the key done, or release it). A panic becomes a terminal outcome.
func (c *Consumer) handle(ctx context.Context, d amqp.Delivery, span tracing.Span, log *zap.Logger) (out outcome) {
	var cs claimState
	held := false // a claim this call must still mark done or release
	defer func() {
		if r := recover(); r != nil {
			log.Error("panic while handling", zap.String("order_no", out.orderNo),
				zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
			out.kind, out.class, out.err = Terminal, ClassPanic, fmt.Errorf("%w: %v", errPanic, r)
			if held {
				c.release(ctx, out.orderNo, cs.claim, "panic", log)
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

	classified := func(err error) outcome {
		out.err = err
		out.kind, out.class = classify(err)
		return out
	}

	cs, err = c.claim(ctx, p.OrderNo, log)
	if err != nil {
		return classified(err)
	}
	out.degraded = cs.degraded
	held = cs.state == idem.Claimed
	fault.Point("after_claim")

	if wait, err := c.checkClaim(ctx, p, cs, out.key, log); err != nil {
		out.wait = wait
		return classified(err)
	}
	err = c.pay(ctx, p, span)
	c.finishClaim(ctx, p.OrderNo, out.key, cs.claim, held, err, log)
	held = false
	return classified(err)
}

// checkClaim asks the database when the claim found the key taken (done,
// in flight or foreign): Redis alone never drops a message. It returns
// why the payment is not to be made now (already paid: a duplicate; in
// flight, with the other holder's remaining lease as wait), or nil to go
// on and pay.
func (c *Consumer) checkClaim(ctx context.Context, p order.Payment, cs claimState, key string, log *zap.Logger) (wait time.Duration, err error) {
	if cs.state != idem.Done && cs.state != idem.InFlight && cs.state != idem.Foreign {
		return 0, nil
	}
	switch err := c.orders.Check(ctx, p); {
	case err != nil:
		return 0, err // already paid → duplicate; or why not
	case cs.state == idem.InFlight:
		return cs.claim.Remaining, fmt.Errorf("order %s: %w (lease %s left)", p.OrderNo, errInFlight, cs.claim.Remaining.Round(time.Millisecond))
	case cs.state == idem.Foreign:
		// Not paysvc's value (a hand-written consumer's mark, left by
		// the consumer paysvc replaced): no lease to wait for. The
		// database's guards decide alone, as when Redis is skipped; the
		// key is left as it is.
		c.m.Disagreements.WithLabelValues("redis_foreign_db_unpaid").Inc()
		log.Warn("redis key holds a value paysvc does not write; the database guards alone",
			zap.String("order_no", p.OrderNo), zap.String("idem_key", key))
	default:
		c.m.Disagreements.WithLabelValues("redis_done_db_unpaid").Inc()
		log.Warn("redis and database disagree: key says done, order is not paid; applying",
			zap.String("order_no", p.OrderNo), zap.String("idem_key", key))
	}
	return 0, nil
}

// pay applies the payment through the Payer, in a database span that is
// a child of the message's; the notice the payment writes carries it as
// its parent.
func (c *Consumer) pay(ctx context.Context, p order.Payment, span tracing.Span) error {
	db := c.cfg.Spans.Child(span, "paysvc pay", tracing.KindClient, time.Now())
	p.Trace = db.Context.String()
	err := c.payer.Pay(ctx, p)
	if db.Recording() {
		db.SetAttributes(attribute.String("db.system", "mysql"), attribute.String("paysvc.order_no", p.OrderNo))
		db.End(errText(err))
	}
	if err == nil {
		fault.Point("after_commit")
	}
	return err
}

// finishClaim ends the claim this call holds (held), after the payment
// returned err: applied or a duplicate, the key is marked done; anything
// else releases it. Both are bounded even when ctx has ended.
func (c *Consumer) finishClaim(ctx context.Context, orderNo, key string, claim idem.Claim, held bool, err error, log *zap.Logger) {
	kind, _ := classify(err)
	bg, cancelBg := context.WithTimeout(context.WithoutCancel(ctx), lateWriteTimeout)
	defer cancelBg()
	switch {
	case !held:
	case kind == Applied || kind == Duplicate:
		if kind == Duplicate {
			// Redis let the message through as new; the database had it.
			c.m.Disagreements.WithLabelValues("redis_new_db_applied").Inc()
			log.Info("redis and database disagree: key was new, the database had the payment",
				zap.String("order_no", orderNo), zap.String("idem_key", key))
		}
		if err := c.guard.Done(bg, orderNo); err != nil {
			log.Warn("could not mark the key done; its lease will expire and the database stays the guard",
				zap.String("order_no", orderNo), zap.Error(err))
		}
	default:
		c.release(ctx, orderNo, claim, "failure", log)
	}
}

// claimState is what claiming an order's Redis key found.
type claimState struct {
	// state is Claimed (this call holds the lease: mark it done or release
	// it), Done, InFlight or Foreign; 0 when the guard was skipped
	// (degraded).
	state idem.State
	// claim is the lease held, or what the key held (Remaining, for
	// InFlight).
	claim idem.Claim
	// degraded: no Redis guard for this message, the database guards
	// alone (OPEN).
	degraded bool
}

// claim takes the order's Redis key. Under CLOSED, Redis trouble is an
// errRedisUnavailable; under OPEN it is a degraded claim (the database guards
// alone), and Redis is skipped for redisSkip.
func (c *Consumer) claim(ctx context.Context, orderNo string, log *zap.Logger) (claimState, error) {
	open := c.cfg.RedisFallback == FallbackOpen
	if open && time.Now().UnixNano() < c.redisDownUntil.Load() {
		c.m.Degraded.Set(1)
		log.Warn("redis guard skipped: degraded (idempotent.redisFallback=OPEN)", zap.String("order_no", orderNo))
		return claimState{degraded: true}, nil
	}
	st, claim, err := c.guard.Claim(ctx, orderNo)
	if err == nil {
		c.m.Degraded.Set(0)
		return claimState{state: st, claim: claim}, nil
	}
	// The SET may have landed before the reply was lost: free it if we can.
	c.release(ctx, orderNo, claim, "claim error", log)
	if !open {
		return claimState{claim: claim}, fmt.Errorf("%w: %w", errRedisUnavailable, err)
	}
	c.redisDownUntil.Store(time.Now().Add(redisSkip).UnixNano())
	c.m.Degraded.Set(1)
	log.Warn("redis unavailable: going on with the database guards alone (idempotent.redisFallback=OPEN)",
		zap.String("order_no", orderNo), zap.Error(err))
	return claimState{claim: claim, degraded: true}, nil
}

// release deletes the claim if it still holds its token, even when ctx is
// done (but within lateWriteTimeout), and logs whether a key was deleted.
func (c *Consumer) release(ctx context.Context, orderNo string, claim idem.Claim, after string, log *zap.Logger) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateWriteTimeout)
	defer cancel()
	released, err := c.guard.Release(bg, claim)
	log.Info("idem key released", zap.String("order_no", orderNo), zap.String("idem_key", claim.Key),
		zap.Bool("deleted", released), zap.NamedError("release_error", err), zap.String("after", after))
}
