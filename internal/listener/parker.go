package listener

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/tracing"
)

// Parker consumes q.pay.dlx.terminal into t_dead_letter. Each message is
// acked only after its row is committed, so nothing is lost between the queue
// and the table, and nothing depends on browsing a queue.
type Parker struct {
	URL      string
	Name     string
	TLS      *tls.Config // for amqps://; nil: system roots
	Store    *deadletter.Store
	Log      *zap.Logger
	OnParked func(id int64, becameNew bool) // optional: wake the alerter
	Metrics  *metrics.Metrics               // optional
	// Timeout bounds each database write (0: DefaultParkTimeout), so that a
	// black-holed MySQL cannot hold the parker, or shutdown, forever.
	Timeout time.Duration
	// TerminalDeliveryLimit is the terminal queue's, as in Topology.
	TerminalDeliveryLimit int
	// ConsumerTimeout, if not 0, is the consumes' x-consumer-timeout, as
	// the consumer's (Config.ConsumerTimeout): the parker holds a message
	// through a database outage.
	ConsumerTimeout time.Duration

	inHand atomic.Int32 // messages taken from the queues, not yet parked nor given back
}

// Holding is how many terminal messages the parker has taken from its
// queues and not parked yet: the one it is parking (held for as long as
// the database is down or slow) and the one the other queue sent it
// meanwhile (parkerPrefetch each). They are unacked, so no queue's depth
// counts them; 0 once they are parked or given back to their queues.
func (p *Parker) Holding() int { return int(p.inHand.Load()) }

// DefaultParkTimeout bounds one parking's database writes.
const DefaultParkTimeout = 10 * time.Second

// parkerMaxBackoff caps the parker's reconnect backoff and its wait between
// attempts to park a held message.
const parkerMaxBackoff = 15 * time.Second

// parkerPrefetch is how many messages of each queue (terminal, overflow)
// the broker may send the parker ahead of its acks. One: terminal messages
// are few and parked one at a time, and while the database is down the
// parker holds the one it tries and at most one of the other queue's
// (Holding), and the rest stay ready in the queues: paysvc_terminal_pending
// counts both.
const parkerPrefetch = 1

// ClassUnparkable is the class of a terminal message the table refused as
// it came (a value no column takes), parked with its body alone.
const ClassUnparkable = "unparkable"

// Run parks terminal messages until ctx ends, reconnecting with backoff.
func (p *Parker) Run(ctx context.Context) {
	broker.Reconnect{
		Max: parkerMaxBackoff,
		Ended: func(err error, wait time.Duration) {
			p.Log.Warn("parker: session ended; reconnecting", zap.Error(err), zap.Duration("backoff", wait))
		},
	}.Run(ctx, p.session)
}

func (p *Parker) session(ctx context.Context) error {
	conn, err := broker.Dial(p.URL, p.Name+" parker", p.TLS)
	if err != nil {
		return err
	}
	defer broker.CloseConn(conn) // bounded: a blocked broker may never answer
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := declareTerminal(ch, p.TerminalDeliveryLimit); err != nil {
		return err
	}
	if err := ch.Qos(parkerPrefetch, 0, false); err != nil {
		return err
	}
	// The terminal queue, and what it dead-lettered past its delivery limit.
	var args amqp.Table
	if p.ConsumerTimeout > 0 {
		args = amqp.Table{"x-consumer-timeout": p.ConsumerTimeout.Milliseconds()}
	}
	terminal, err := ch.Consume(TerminalQueue, "", false /* autoAck: ack after the row commits */, false, false, false, args)
	if err != nil {
		return err
	}
	overflow, err := ch.Consume(OverflowQueue, "", false, false, false, false, args)
	if err != nil {
		return err
	}
	mctx, stop := context.WithCancel(ctx)
	deliveries := merge(mctx, &p.inHand, terminal, overflow)
	defer func() {
		// merge's goroutines end with the session; what they took and
		// did not hand on goes back to its queue as the channel closes.
		stop()
		for range deliveries {
			p.inHand.Add(-1)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil // unacked messages return to the queue as the channel closes
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("terminal deliveries closed (the channel ended, or the broker cancelled a consumer)")
			}
			parked := parkedFrom(d, time.Now())
			id, becameNew, err := p.park(ctx, parked)
			for bo := (broker.Backoff{Max: parkerMaxBackoff}); err != nil; {
				// The database is unreachable or slow: hold the message and
				// try again (returned, it would count toward the terminal
				// queue's delivery limit); at shutdown the closing channel
				// gives it back.
				wait := bo.Next()
				p.Log.Warn("parker: cannot park; holding the message and trying again", zap.String("order_no", parked.OrderNo),
					zap.String("trace_id", parked.TraceID), zap.Error(err), zap.Duration("backoff", wait))
				if !broker.Sleep(ctx, wait) {
					p.inHand.Add(-1) // the closing channel gives it back
					return nil
				}
				id, becameNew, err = p.park(ctx, parked)
			}
			p.inHand.Add(-1) // its row counts now
			if err := d.Ack(false); err != nil {
				// The row is committed; the redelivered message matches its
				// fingerprint and changes nothing.
				return err
			}
			p.Log.Info("terminal message parked", zap.Int64("dead_letter_id", id), zap.String("order_no", parked.OrderNo),
				zap.String("trace_id", parked.TraceID), zap.String("error_class", parked.ErrorClass), zap.Bool("new", becameNew))
			if p.OnParked != nil {
				p.OnParked(id, becameNew)
			}
		}
	}
}

// park stores one terminal message within the write bound. A message whose
// values the table refuses even after Store.Park cut them to fit is parked
// with its body alone and the refusal as its reason, so that no message can
// stop the parking of the others.
func (p *Parker) park(ctx context.Context, parked deadletter.Parked) (int64, bool, error) {
	timeout := cmp.Or(p.Timeout, DefaultParkTimeout)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	id, becameNew, err := p.Store.Park(pctx, parked)
	if err == nil || !sqldb.IsDataRejected(err) {
		return id, becameNew, err
	}
	p.Log.Error("parker: the dead-letter table refused this terminal message; parking its body alone",
		zap.String("order_no", parked.OrderNo), zap.String("trace_id", parked.TraceID), zap.String("error_class", parked.ErrorClass), zap.Error(err))
	if p.Metrics != nil {
		p.Metrics.ParkFallbacks.Inc()
	}
	bare := deadletter.Parked{Body: parked.Body, Headers: "{}", ErrorClass: ClassUnparkable,
		LastError: fmt.Sprintf("the dead-letter table refused this message with its headers (%v); it was %s: %s",
			err, parked.ErrorClass, parked.LastError),
		RetryCount: parked.RetryCount, FirstFailedAt: parked.FirstFailedAt, LastFailedAt: parked.LastFailedAt}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return p.Store.Park(bctx, bare)
}

// parkedFrom reads what the terminal copy says about itself. A message the
// broker dead-lettered on its own (no x-error-class) is kept too.
func parkedFrom(d amqp.Delivery, now time.Time) deadletter.Parked {
	p := deadletter.Parked{
		Body:       d.Body,
		ErrorClass: headerString(d.Headers, HeaderErrorClass),
		LastError:  headerString(d.Headers, HeaderLastError),
		RetryCount: retryCount(d.Headers),
	}
	if pay, err := DecodePayment(d.Body); err == nil {
		p.OrderNo, p.UserID, p.Amount = pay.OrderNo, &pay.UserID, &pay.Amount
	} else {
		p.OrderNo = lenientOrderNo(d.Body)
	}
	if tc, ok := tracing.FromHeaders(d.Headers); ok {
		p.TraceID = tc.TraceIDHex()
	}
	p.FirstFailedAt = headerTime(d.Headers, HeaderFirstFailedAt, now)
	p.LastFailedAt = headerTime(d.Headers, HeaderLastFailedAt, now)
	if death, ok := brokerDeath(d.Headers); ok {
		// The broker put it here (delivery limit, rejection, expiry) after
		// whatever paysvc decided last: the reason is the broker's.
		reason := "dead-lettered by the broker: " + death.String()
		if p.ErrorClass != "" {
			reason += fmt.Sprintf(" (before that, paysvc: %s: %s)", p.ErrorClass, p.LastError)
		}
		p.LastError = reason
		p.ErrorClass = ClassDeadLettered
		if !death.at.IsZero() {
			p.LastFailedAt = death.at
		}
	}
	h, err := json.Marshal(d.Headers)
	if err != nil {
		h, _ = json.Marshal(fmt.Sprint(d.Headers))
	}
	p.Headers = string(h)
	return p
}

func headerString(h amqp.Table, key string) string {
	s, _ := h[key].(string)
	return s
}

func headerTime(h amqp.Table, key string, def time.Time) time.Time {
	if t, err := time.Parse(time.RFC3339Nano, headerString(h, key)); err == nil {
		return t
	}
	return def
}

// ClassDeadLettered is the class of a message the broker put in the
// terminal queue by itself.
const ClassDeadLettered = "dead_lettered"

// death is the broker's newest x-death entry.
type death struct {
	reason, queue string
	count         int64
	at            time.Time
}

func (d death) String() string {
	s := fmt.Sprintf("%s from %s", cmp.Or(d.reason, "unknown reason"), cmp.Or(d.queue, "an unknown queue"))
	if d.count > 1 {
		s += fmt.Sprintf(" (%d times)", d.count)
	}
	return s
}

// brokerDeath reports whether the broker, not paysvc, moved the message into
// the terminal queue last, and how. paysvc marks its own terminal copies
// (x-routed-to); for copies made before that mark, paysvc's own terminal
// copy carries at most the x-death of the wait queue that brought it back
// to the main queue, while the broker's newest x-death (it comes first)
// names the queue it dead-lettered the message from.
func brokerDeath(h amqp.Table) (death, bool) {
	var d death
	if deaths, ok := h["x-death"].([]any); ok && len(deaths) > 0 {
		if t, ok := deaths[0].(amqp.Table); ok {
			d.reason, _ = t["reason"].(string)
			d.queue, _ = t["queue"].(string)
			d.count, _ = t["count"].(int64)
			d.at, _ = t["time"].(time.Time)
		}
	}
	if to, ok := h[HeaderRoutedTo].(string); ok {
		return d, to != TerminalQueue
	}
	if headerString(h, HeaderErrorClass) == "" {
		return d, true // paysvc never saw it fail
	}
	return d, d.queue != "" && !strings.HasPrefix(d.queue, waitPrefix)
}

// lenientOrderNo finds a usable orderNo in a body that failed strict
// decoding, so that its dead letter is still filed under the order.
func lenientOrderNo(body []byte) string {
	var m map[string]json.RawMessage
	if len(body) > MaxBody || json.Unmarshal(body, &m) != nil {
		return ""
	}
	var s string
	if json.Unmarshal(m[keyOrderNo], &s) != nil || !orderNoPattern.MatchString(s) {
		return ""
	}
	return s
}

// declareTerminal declares the terminal and overflow queues and their
// bindings, as DeclareTopology does.
func declareTerminal(ch *amqp.Channel, limit int) error {
	if err := ch.ExchangeDeclare(DLXExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return mismatch("exchange", DLXExchange, err)
	}
	for _, q := range []struct {
		name string
		args amqp.Table
	}{{TerminalQueue, terminalArgs(limit)}, {OverflowQueue, overflowArgs}} {
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, q.args); err != nil {
			return mismatch("queue", q.name, err)
		}
		if err := ch.QueueBind(q.name, q.name, DLXExchange, false, nil); err != nil {
			return err
		}
	}
	return nil
}

// merge delivers what a and b deliver. It closes its channel as soon as
// either is closed (the channel ended, or the broker cancelled that
// consumer: a deleted queue) or ctx ends, so that the session ends and the
// next one declares and consumes both queues again, instead of going on
// with one. inHand counts each delivery from the moment merge takes it;
// one taken but not handed on is unacked: it goes back to its queue as the
// channel closes, and merge takes it off inHand.
func merge(ctx context.Context, inHand *atomic.Int32, a, b <-chan amqp.Delivery) <-chan amqp.Delivery {
	out := make(chan amqp.Delivery)
	stop := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for _, in := range []<-chan amqp.Delivery{a, b} {
		wg.Go(func() {
			defer once.Do(func() { close(stop) })
			for {
				select {
				case d, ok := <-in:
					if !ok {
						return
					}
					inHand.Add(1)
					select {
					case out <- d:
					case <-stop:
						inHand.Add(-1)
						return
					case <-ctx.Done():
						inHand.Add(-1)
						return
					}
				case <-stop:
					return
				case <-ctx.Done():
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(out) }()
	return out
}
