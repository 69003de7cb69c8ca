package listener

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Retry headers on copies published to the wait and terminal queues.
const (
	HeaderRetryCount    = "x-retry-count"
	HeaderErrorClass    = "x-error-class"
	HeaderLastError     = "x-last-error"
	HeaderFirstFailedAt = "x-first-failed-at"
	HeaderLastFailedAt  = "x-last-failed-at"
)

const maxErrorText = 1024

// RetryPolicy says where a failed message goes next.
type RetryPolicy struct {
	Delays      []time.Duration // wait for attempt n is Delays[n-1]; the last repeats
	MaxAttempts int             // retries before the terminal queue
}

// retryCount reads x-retry-count; absent or malformed counts as 0.
func retryCount(h amqp.Table) int {
	switch v := h[HeaderRetryCount].(type) {
	case int8:
		return max(int(v), 0)
	case int16:
		return max(int(v), 0)
	case int32:
		return max(int(v), 0)
	case int64:
		return int(max(v, 0))
	case int:
		return max(v, 0)
	}
	return 0
}

// next returns the queue a failed message goes to and the retry count its
// copy carries. A terminal kind, or a retryable one past MaxAttempts, goes to
// the terminal queue with the count unchanged.
func (p RetryPolicy) next(kind Kind, count int) (queue string, newCount int) {
	if kind == Terminal || count >= p.MaxAttempts || len(p.Delays) == 0 {
		return TerminalQueue, count
	}
	i := min(count, len(p.Delays)-1)
	return WaitQueue(p.Delays[i]), count + 1
}

// failedCopy builds the copy of d published to a wait or terminal queue.
func failedCopy(d amqp.Delivery, count int, class Class, cause error, now time.Time) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	text := cause.Error()
	if len(text) > maxErrorText {
		text = text[:maxErrorText]
	}
	ts := now.UTC().Format(time.RFC3339Nano)
	h[HeaderRetryCount] = int32(count)
	h[HeaderErrorClass] = string(class)
	h[HeaderLastError] = text
	h[HeaderLastFailedAt] = ts
	if _, ok := h[HeaderFirstFailedAt].(string); !ok {
		h[HeaderFirstFailedAt] = ts
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}

// publisher publishes one message at a time on its own channel, in confirm
// mode and with mandatory set, so that a returned message is told apart from
// a routed one: the broker sends basic.return before the basic.ack of the
// same publish, and the client delivers them in that order.
type publisher struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	timeout time.Duration
}

func newPublisher(conn *amqp.Connection, timeout time.Duration) *publisher {
	return &publisher{conn: conn, timeout: timeout}
}

var errUnroutable = errors.New("returned unroutable")

// publish sends msg to ex.pay.dlx with routing key queue and waits for the
// broker's confirm. Any error means the copy is not safely stored.
func (p *publisher) publish(ctx context.Context, queue string, msg amqp.Publishing) error {
	if err := p.open(); err != nil {
		return err
	}
	for len(p.returns) > 0 { // drop a stale return, if any
		<-p.returns
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	conf, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, DLXExchange, queue,
		true,  // mandatory: an unroutable copy comes back instead of vanishing
		false, // immediate: unsupported by RabbitMQ
		msg)
	if err != nil {
		p.reset()
		return fmt.Errorf("publish to %s: %w", queue, err)
	}
	acked, err := conf.WaitContext(ctx)
	if err != nil {
		p.reset()
		return fmt.Errorf("publish to %s: confirm: %w", queue, err)
	}
	if !acked {
		return fmt.Errorf("publish to %s: nacked by the broker", queue)
	}
	select {
	case r := <-p.returns:
		return fmt.Errorf("publish to %s: %w: %d %s", queue, errUnroutable, r.ReplyCode, r.ReplyText)
	default:
	}
	return nil
}

func (p *publisher) open() error {
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	ch, err := p.conn.Channel()
	if err != nil {
		return fmt.Errorf("publisher channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return fmt.Errorf("publisher confirms: %w", err)
	}
	p.ch = ch
	p.returns = ch.NotifyReturn(make(chan amqp.Return, 4))
	return nil
}

// reset drops the channel after an error whose state is unclear; the next
// publish opens a fresh one.
func (p *publisher) reset() {
	if p.ch != nil {
		p.ch.Close()
		p.ch = nil
	}
}

func (p *publisher) close() { p.reset() }
