package listener

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
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
}

// Run parks terminal messages until ctx ends, reconnecting with backoff.
func (p *Parker) Run(ctx context.Context) {
	bo := broker.Backoff{Max: 15 * time.Second}
	for ctx.Err() == nil {
		started := time.Now()
		err := p.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			bo.Reset()
		}
		wait := bo.Next()
		p.Log.Warn("parker: session ended; reconnecting", zap.Error(err), zap.Duration("backoff", wait))
		if !broker.Sleep(ctx, wait) {
			return
		}
	}
}

func (p *Parker) session(ctx context.Context) error {
	conn, err := broker.Dial(p.URL, p.Name+" parker", p.TLS)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := declareTerminal(ch); err != nil {
		return err
	}
	if err := ch.Qos(16, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(TerminalQueue, "", false /* autoAck: ack after the row commits */, false, false, false, nil)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil // unacked messages return to the queue as the channel closes
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("terminal deliveries closed")
			}
			parked := parkedFrom(d, time.Now())
			id, becameNew, err := p.Store.Park(context.WithoutCancel(ctx), parked)
			if err != nil {
				d.Nack(false, true)
				return err
			}
			if err := d.Ack(false); err != nil {
				// The row is committed; the redelivered message matches its
				// fingerprint and changes nothing.
				return err
			}
			p.Log.Info("terminal message parked", zap.Int64("dead_letter_id", id), zap.String("order_no", parked.OrderNo),
				zap.String("error_class", parked.ErrorClass), zap.Bool("new", becameNew))
			if p.OnParked != nil {
				p.OnParked(id, becameNew)
			}
		}
	}
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
	if p.ErrorClass == "" {
		p.ErrorClass, p.LastError = "dead_lettered", "dead-lettered by the broker: "+deathReason(d.Headers)
	}
	p.FirstFailedAt = headerTime(d.Headers, HeaderFirstFailedAt, now)
	p.LastFailedAt = headerTime(d.Headers, HeaderLastFailedAt, now)
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

func deathReason(h amqp.Table) string {
	if deaths, ok := h["x-death"].([]any); ok && len(deaths) > 0 {
		if d, ok := deaths[0].(amqp.Table); ok {
			return fmt.Sprintf("%v from %v", d["reason"], d["queue"])
		}
	}
	return "unknown reason"
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

// declareTerminal declares the terminal queue and its binding, as Declare does.
func declareTerminal(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(DLXExchange, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
		return mismatch("exchange", DLXExchange, err)
	}
	if _, err := ch.QueueDeclare(TerminalQueue, true, false, false, false, terminalArgs); err != nil {
		return mismatch("queue", TerminalQueue, err)
	}
	return ch.QueueBind(TerminalQueue, TerminalQueue, DLXExchange, false, nil)
}
