// Package producer publishes payment messages to paysvc so that none is
// lost before paysvc sees it.
//
// A payment is lost on the producer's side when a message is sent and
// never stored: the broker refused it (basic.nack: a queue at its length
// limit, a quorum queue without a leader), no queue took it (q.pay.success
// not declared or deleted: without mandatory the broker drops it
// silently), or the connection dropped before the broker said anything.
// The Producer publishes each message persistent and mandatory on a
// channel in confirm mode, and counts a message published only when the
// broker confirmed it and did not return it. Anything else is published
// again, a bounded number of times, with backoff: on a new channel after a
// nack, on a new connection after a failure, trying each broker URL in
// turn. A copy is harmless (paysvc applies a
// payment once); a loss is not.
//
// Every Publish reports each payment exactly once: nil when the broker
// confirmed it (it is stored, and not published again), or an error when
// it was not confirmed within Config.Attempts. The error wraps the last
// attempt's outcome, ErrNacked, ErrReturned, ErrUnconfirmed (sent, outcome
// unknown) or ErrNoConnection, and also ErrUnconfirmed when any attempt's
// outcome was unknown: such a payment may be stored after all. A payment
// that breaks the contract is reported ErrInvalid and never sent. A failed
// payment is the caller's to keep and publish again later (from its own
// outbox, say): publishing it twice is safe.
//
// Each message carries the W3C traceparent header and the AMQP timestamp
// (when it was published), and a message id of its own.
//
// During a resource alarm the broker stops reading from connections that
// publish: attempts run out of time (Config.Timeout) unconfirmed, and the
// payments are reported failed with ErrUnconfirmed once the attempts are
// spent.
package producer

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Queue is paysvc's payment queue; payments are published to it through
// the default exchange, with it as the routing key.
const Queue = "q.pay.success"

// Errors a failed payment wraps: the outcome of its last attempt.
var (
	// ErrNacked: the broker refused the message (basic.nack); it is not
	// stored.
	ErrNacked = errors.New("producer: nacked by the broker")
	// ErrReturned: no queue took the message (basic.return of a mandatory
	// publish: q.pay.success does not exist); it is not stored.
	ErrReturned = errors.New("producer: returned unroutable")
	// ErrUnconfirmed: the message was sent and its confirm did not come
	// (the connection dropped, the wait ran out): it may be stored, or not.
	ErrUnconfirmed = errors.New("producer: outcome unknown: sent, not confirmed")
	// ErrNoConnection: no broker URL answered; nothing was sent.
	ErrNoConnection = errors.New("producer: no connection")
)

// Config is how a Producer connects and retries. Only URLs is required.
type Config struct {
	// URLs are the broker's nodes (amqp:// or amqps://, with user,
	// password and vhost). A connection goes to the first that answers,
	// starting after the one the last connection used.
	URLs []string
	TLS  *tls.Config // for amqps://; nil: the system roots
	Name string      // the connection's name in the broker; "": "paysvc-producer"
	// Attempts is how often one payment is published before it is
	// reported failed; 0: DefaultAttempts.
	Attempts int
	// Timeout bounds one attempt: the connection, the publishes and the
	// wait for their confirms; 0: DefaultTimeout.
	Timeout time.Duration
	// Backoff is the wait before the second attempt, doubled before each
	// next one up to MaxBackoff; 0: DefaultBackoff.
	Backoff time.Duration
}

// Defaults: 8 attempts over about 20 s of backoff ride out a broker node's
// restart or a quorum queue's leader election.
const (
	DefaultAttempts = 8
	DefaultTimeout  = 10 * time.Second
	DefaultBackoff  = 250 * time.Millisecond
	MaxBackoff      = 5 * time.Second
)

// closeTimeout bounds the close of a connection given up on.
const closeTimeout = 5 * time.Second

// maxInFlight is the most messages sent before their confirms are waited
// for; a larger Publish goes in slices of it.
const maxInFlight = 256

// Producer publishes payments. It is safe for concurrent use: attempts
// share one channel and take turns; backoffs do not hold it.
type Producer struct {
	cfg Config

	mu      sync.Mutex
	next    int // the URL the next dial tries first
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

// New returns a Producer; it connects on first use.
func New(cfg Config) (*Producer, error) {
	if len(cfg.URLs) == 0 {
		return nil, errors.New("producer: no broker URL")
	}
	for i, u := range cfg.URLs {
		if u == "" {
			return nil, fmt.Errorf("producer: broker URL %d of %d is empty", i+1, len(cfg.URLs))
		}
	}
	cfg.Name = cmp.Or(cfg.Name, "paysvc-producer")
	cfg.Attempts = cmp.Or(cfg.Attempts, DefaultAttempts)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.Backoff = cmp.Or(cfg.Backoff, DefaultBackoff)
	return &Producer{cfg: cfg}, nil
}

// Publish publishes one payment; nil means the broker confirmed it.
func (p *Producer) Publish(ctx context.Context, pay Payment) error {
	return p.PublishBatch(ctx, []Payment{pay})[0]
}

// PublishBatch publishes payments together (one confirm wait per attempt
// for up to 256 of them) and returns each one's outcome: errs[i] is nil
// when payments[i] was confirmed. A payment that breaks the contract is
// reported ErrInvalid and not sent.
func (p *Producer) PublishBatch(ctx context.Context, payments []Payment) (errs []error) {
	errs = make([]error, len(payments))
	msgs := make([]Message, 0, len(payments))
	index := make([]int, 0, len(payments))
	for i, pay := range payments {
		m, err := pay.Message()
		if err != nil {
			errs[i] = err
			continue
		}
		msgs = append(msgs, m)
		index = append(index, i)
	}
	for j, err := range p.PublishMessages(ctx, msgs) {
		if err != nil {
			errs[index[j]] = fmt.Errorf("order %s: %w", payments[index[j]].OrderNo, err)
		}
	}
	return errs
}

// PublishMessages publishes messages as they are, as PublishBatch does.
func (p *Producer) PublishMessages(ctx context.Context, msgs []Message) (errs []error) {
	errs = make([]error, len(msgs))
	pubs := make([]amqp.Publishing, len(msgs))
	for i, m := range msgs {
		pubs[i] = amqp.Publishing{
			Headers:      amqp.Table{"traceparent": cmp.Or(m.Traceparent, NewTraceparent())},
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    messageID(), // tells a return apart
			Body:         m.Body,
		}
	}
	pending := make([]int, len(msgs))
	for i := range pending {
		pending[i] = i
	}
	unknown := make([]bool, len(msgs)) // an attempt may have stored it
	backoff := p.cfg.Backoff
	attempts := 0
	for len(pending) > 0 {
		attempts++
		var failed []int
		for start := 0; start < len(pending); start += maxInFlight {
			slice := pending[start:min(start+maxInFlight, len(pending))]
			for k, err := range p.attempt(ctx, pubs, slice) {
				i := slice[k]
				errs[i] = err
				if err != nil {
					failed = append(failed, i)
					unknown[i] = unknown[i] || errors.Is(err, ErrUnconfirmed)
				}
			}
		}
		pending = failed
		if len(pending) == 0 || attempts == p.cfg.Attempts || !sleep(ctx, backoff) {
			break
		}
		backoff = min(2*backoff, MaxBackoff)
	}
	for _, i := range pending {
		err := errs[i]
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		if unknown[i] && !errors.Is(err, ErrUnconfirmed) {
			err = fmt.Errorf("%w; before: %w", err, ErrUnconfirmed)
		}
		errs[i] = fmt.Errorf("not confirmed after %d attempts: %w", attempts, err)
	}
	return errs
}

// attempt publishes each message pubs[which[k]] once and waits for their
// confirms; errs[k] is the outcome of pubs[which[k]].
func (p *Producer) attempt(ctx context.Context, pubs []amqp.Publishing, which []int) (errs []error) {
	errs = make([]error, len(which))
	fail := func(from int, err error) []error {
		for k := from; k < len(which); k++ {
			errs[k] = err
		}
		return errs
	}
	if ctx.Err() != nil {
		return fail(0, fmt.Errorf("%w: %w", ErrNoConnection, context.Cause(ctx)))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if err := p.open(ctx); err != nil {
		return fail(0, err)
	}
	// Each attempt waits for every confirm of the last, or leaves its
	// channel: no return of an earlier attempt is left in returns.
	ch, returns := p.ch, p.returns
	confs := make([]*amqp.DeferredConfirmation, len(which))
	sent := len(which)
	nacked := false
	for k, i := range which {
		msg := pubs[i]
		msg.Timestamp = time.Now()
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", Queue,
			true,  // mandatory: no queue, and the broker returns it instead of dropping it
			false, // immediate: not supported by RabbitMQ
			msg)
		if err != nil {
			p.resetLocked()
			fail(k, fmt.Errorf("%w: %w", ErrUnconfirmed, err))
			sent = k
			break
		}
		confs[k] = conf
	}
wait:
	for k := range sent {
		acked, err := confs[k].WaitContext(ctx)
		switch {
		case err != nil:
			// Later confirms may still come; this channel is not trusted
			// with the next attempt.
			p.resetLocked()
			fail(k, fmt.Errorf("%w: %w", ErrUnconfirmed, err))
			break wait
		case !acked && ch.IsClosed():
			// The client settles the confirms of a closing channel as
			// nacks: the broker said nothing.
			p.resetLocked()
			fail(k, fmt.Errorf("%w: the channel closed", ErrUnconfirmed))
			break wait
		case !acked:
			errs[k] = ErrNacked
			nacked = true
		}
	}
	if nacked {
		// A quorum queue over its limit tells each publishing channel
		// to refuse, and has been seen to go on refusing on that channel
		// after it takes messages again (RabbitMQ 3.10): the next attempt
		// gets a channel of its own.
		p.dropChannelLocked()
	}
	// The broker sends a message's return before its ack, and the client
	// hands the return over before it settles the confirm: the returns of
	// the messages confirmed above are all here, even when the channel
	// closed since.
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return errs
			}
			for k, i := range which {
				if pubs[i].MessageId == r.MessageId && errs[k] == nil {
					errs[k] = fmt.Errorf("%w: %d %s", ErrReturned, r.ReplyCode, r.ReplyText)
				}
			}
		default:
			return errs
		}
	}
}

// open makes sure the producer has a connection and a channel in confirm
// mode, dialling the URLs in turn when it has no connection.
func (p *Producer) open(ctx context.Context) error {
	if p.ch != nil && !p.ch.IsClosed() {
		return nil
	}
	if p.conn != nil && !p.conn.IsClosed() {
		if err := p.channelLocked(); err == nil {
			return nil
		}
	}
	p.resetLocked()
	var errs []error
	for range p.cfg.URLs {
		url := p.cfg.URLs[p.next%len(p.cfg.URLs)]
		p.next++
		conn, err := p.dial(ctx, url)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.conn = conn
		if err := p.channelLocked(); err != nil {
			p.resetLocked()
			errs = append(errs, err)
			continue
		}
		return nil
	}
	// amqp091's errors never carry the URL, so no password leaks here.
	return fmt.Errorf("%w: %w", ErrNoConnection, errors.Join(errs...))
}

// channelLocked opens the channel, in confirm mode, on the connection.
func (p *Producer) channelLocked() error {
	ch, err := p.conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		ch.Close()
		return err
	}
	p.ch = ch
	// Returns of a whole slice must fit: the client hands them over from
	// its reader, which would stop on a full channel.
	p.returns = ch.NotifyReturn(make(chan amqp.Return, maxInFlight))
	return nil
}

func (p *Producer) dial(ctx context.Context, url string) (*amqp.Connection, error) {
	cfg := amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": p.cfg.Name},
		Dial:       amqp.DefaultDial(5 * time.Second),
	}
	if p.cfg.TLS != nil {
		cfg.TLSClientConfig = p.cfg.TLS.Clone() // amqp091 writes ServerName into it
	}
	type dialed struct {
		conn *amqp.Connection
		err  error
	}
	done := make(chan dialed, 1)
	go func() {
		conn, err := amqp.DialConfig(url, cfg)
		done <- dialed{conn, err}
	}()
	select {
	case d := <-done:
		return d.conn, d.err
	case <-ctx.Done():
		go func() { // a connection made too late is nobody's
			if d := <-done; d.conn != nil {
				d.conn.Close()
			}
		}()
		return nil, context.Cause(ctx)
	}
}

// resetLocked drops the connection after a failure whose state is unclear;
// the next attempt dials again. The close is not waited for, and is bounded:
// a broker that stopped reading the connection (a resource alarm blocks
// publishing connections) never answers it.
func (p *Producer) resetLocked() {
	if conn := p.conn; conn != nil {
		go conn.CloseDeadline(time.Now().Add(closeTimeout))
	}
	p.conn, p.ch, p.returns = nil, nil, nil
}

// dropChannelLocked closes the channel and keeps the connection; the next
// attempt opens a channel.
func (p *Producer) dropChannelLocked() {
	if p.ch != nil {
		go p.ch.Close()
	}
	p.ch, p.returns = nil, nil
}

// Close closes the producer's connection. Publishing after Close dials
// again.
func (p *Producer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	if p.conn != nil {
		err = p.conn.Close()
	}
	p.conn, p.ch, p.returns = nil, nil, nil
	return err
}

func messageID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
