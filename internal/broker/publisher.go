package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Publisher publishes one message at a time on its own channel, in confirm
// mode and with mandatory set, so that a returned message is told apart from
// a routed one: the broker sends basic.return before the basic.ack of the
// same publish, and the client delivers them in that order. It is not safe
// for concurrent use: give each goroutine its own.
type Publisher struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	timeout time.Duration
}

// NewPublisher returns a Publisher on conn; timeout bounds each publish and
// its confirm.
func NewPublisher(conn *amqp.Connection, timeout time.Duration) *Publisher {
	return &Publisher{conn: conn, timeout: timeout}
}

// ErrUnroutable: the broker returned a mandatory message no queue took.
var ErrUnroutable = errors.New("returned unroutable")

// ErrNacked: the broker refused the message (basic.nack): a queue at its
// length limit with x-overflow reject-publish, or an internal error. It is
// not stored.
var ErrNacked = errors.New("nacked by the broker")

// ErrNoChannel: the publisher could not open its channel (nothing was
// sent).
var ErrNoChannel = errors.New("no publisher channel")

// ErrUnconfirmed: the message was written to the broker, and its confirm
// did not come (the wait ran out, the context ended, the connection
// dropped): it may be stored and routed, or not. Not safely stored; not
// safely absent either.
var ErrUnconfirmed = errors.New("outcome unknown: sent, not confirmed")

// Publish sends msg to exchange with routing key key, mandatory, and waits for
// the broker's confirm. Any error means the message is not safely stored.
func (p *Publisher) Publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if err := p.open(ctx); err != nil {
		return err
	}
	for len(p.returns) > 0 { // drop a stale return, if any
		<-p.returns
	}
	conf, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key,
		true,  // mandatory: an unroutable copy comes back instead of vanishing
		false, // immediate: unsupported by RabbitMQ
		msg)
	if err != nil {
		p.reset()
		return fmt.Errorf("publish to %s/%s: %w", exchange, key, err)
	}
	acked, err := conf.WaitContext(ctx)
	if err != nil {
		p.reset()
		return fmt.Errorf("publish to %s/%s: %w: %w", exchange, key, ErrUnconfirmed, err)
	}
	if !acked {
		if p.ch.IsClosed() {
			// The client resolves the confirms a closing channel still
			// waits for as nacks: nothing says the broker refused it.
			p.reset()
			return fmt.Errorf("publish to %s/%s: %w: the channel closed", exchange, key, ErrUnconfirmed)
		}
		return fmt.Errorf("publish to %s/%s: %w", exchange, key, ErrNacked)
	}
	select {
	case r, ok := <-p.returns:
		if !ok { // the channel closed after the ack: the message was routed
			return nil
		}
		return fmt.Errorf("publish to %s/%s: %w: %d %s", exchange, key, ErrUnroutable, r.ReplyCode, r.ReplyText)
	default:
	}
	return nil
}

// MaxBatch is the most messages PublishBatch takes at once.
const MaxBatch = 256

// PublishBatch sends msgs to exchange with routing key key, mandatory, and
// then waits once for all their confirms (within the publisher's timeout).
// errs[i] is nil only when msgs[i] was confirmed and not returned: a batch
// whose publishing or confirm wait stops half way fails whole (some of it
// may be stored, and is sent again by the caller: at least once). Each
// message must have its own MessageId: a returned (unroutable) message is
// told by it.
func (p *Publisher) PublishBatch(ctx context.Context, exchange, key string, msgs []amqp.Publishing) (errs []error) {
	errs = make([]error, len(msgs))
	fail := func(from int, err error) []error {
		for i := from; i < len(msgs); i++ {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	if len(msgs) > MaxBatch {
		return fail(0, fmt.Errorf("publish batch of %d: at most %d", len(msgs), MaxBatch))
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if err := p.open(ctx); err != nil {
		return fail(0, err)
	}
	for len(p.returns) > 0 { // drop stale returns, if any
		<-p.returns
	}
	confs := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, msg := range msgs {
		conf, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, msg)
		if err != nil {
			p.reset()
			// None of the batch is known to be stored: the earlier ones
			// were never confirmed.
			return fail(0, fmt.Errorf("publish to %s/%s: %w", exchange, key, err))
		}
		confs[i] = conf
	}
	for i, conf := range confs {
		acked, err := conf.WaitContext(ctx)
		switch {
		case err != nil:
			// The whole batch fails, not only the unconfirmed rest: an
			// earlier message may have been returned unroutable (its
			// return came before its ack), and reset drops that return.
			p.reset()
			return fail(0, fmt.Errorf("publish to %s/%s: %w: %w", exchange, key, ErrUnconfirmed, err))
		case !acked && p.ch.IsClosed():
			// A closing channel's confirms read as nacks (see Publish).
			p.reset()
			return fail(0, fmt.Errorf("publish to %s/%s: %w: the channel closed", exchange, key, ErrUnconfirmed))
		case !acked:
			errs[i] = fmt.Errorf("publish to %s/%s: %w", exchange, key, ErrNacked)
		}
	}
	// Every return came before its message's ack: they are all here.
	for {
		select {
		case r, ok := <-p.returns:
			if !ok {
				return errs
			}
			for i, msg := range msgs {
				if msg.MessageId == r.MessageId && errs[i] == nil {
					errs[i] = fmt.Errorf("publish to %s/%s: %w: %d %s", exchange, key, ErrUnroutable, r.ReplyCode, r.ReplyText)
				}
			}
		default:
			return errs
		}
	}
}

// open opens the publisher's channel in confirm mode if it has none, within
// ctx: a broker that stops reading the connection (blocked by a resource
// alarm) never answers channel.open.
func (p *Publisher) open(ctx context.Context) error {
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	type opened struct {
		ch  *amqp.Channel
		err error
	}
	done := make(chan opened, 1)
	go func() {
		ch, err := p.conn.Channel()
		if err != nil {
			done <- opened{err: fmt.Errorf("%w: %w", ErrNoChannel, err)}
			return
		}
		if err := ch.Confirm(false); err != nil {
			ch.Close()
			done <- opened{err: fmt.Errorf("%w: confirms: %w", ErrNoChannel, err)}
			return
		}
		done <- opened{ch: ch}
	}()
	var o opened
	select {
	case o = <-done:
	case <-ctx.Done():
		go func() { // the channel it opens late is nobody's
			if o := <-done; o.ch != nil {
				o.ch.Close()
			}
		}()
		return fmt.Errorf("%w: %w", ErrNoChannel, ctx.Err())
	}
	if o.err != nil {
		return o.err
	}
	ch := o.ch
	p.ch = ch
	// Returns of a whole batch must fit: the client delivers them from its
	// reader goroutine, which would block on a full channel.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, MaxBatch))
	return nil
}

// reset drops the channel after an error whose state is unclear; the next
// publish opens a fresh one. The close is not waited for: on a connection
// that stopped answering it waits for the heartbeat to declare it dead.
func (p *Publisher) reset() {
	if p.ch != nil {
		go p.ch.Close()
		p.ch = nil
	}
}

// Close closes the publisher's channel.
func (p *Publisher) Close() { p.reset() }
