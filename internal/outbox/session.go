package outbox

import (
	"cmp"
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
)

// session publishes notices on one connection until ctx ends or the
// connection fails: handed-over notices as they come, due ones at each
// poll. A stop finishes the batch under way and marks what was sent,
// within stopBound.
func (d *Dispatcher) session(ctx context.Context) error {
	conn, err := d.connect()
	if err != nil {
		return err
	}
	defer broker.CloseConn(conn) // bounded: a blocked broker may never answer
	blocking := d.watchBlocking(conn)
	defer d.unwatchBlocking(blocking)
	finish, cancelFinish := finishing(ctx)
	defer cancelFinish()
	pub := broker.NewPublisher(conn, 10*time.Second)
	defer pub.Close()
	s := d.newSending(pub, blocking, finish)
	defer s.close()
	return s.loop(ctx)
}

// connect dials the broker and declares the notice topology.
func (d *Dispatcher) connect() (*amqp.Connection, error) {
	conn, err := broker.Dial(d.URL, d.Name+" outbox", d.TLS)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = Declare(ch)
	}
	if err != nil {
		broker.CloseConn(conn)
		return nil, err
	}
	ch.Close()
	return conn, nil
}

// watchBlocking follows the broker's blocking of conn (a resource alarm)
// into the Blocked gauge and the log. A new connection is not blocked: the
// gauge is this session's, reset by unwatchBlocking.
func (d *Dispatcher) watchBlocking(conn *amqp.Connection) *broker.Blocking {
	if d.Blocked != nil {
		d.Blocked.Set(0)
	}
	return broker.WatchBlocking(conn, func(active bool, reason string) {
		if d.Blocked != nil {
			d.Blocked.Set(0)
			if active {
				d.Blocked.Set(1)
			}
		}
		if active {
			d.Log.Warn("outbox dispatcher: the broker blocks publishing (resource alarm); notices wait until it clears",
				zap.String("reason", reason))
		}
	})
}

// unwatchBlocking ends the calls of watchBlocking's callback, then resets
// the gauge: a notification still buffered cannot set it again after.
func (d *Dispatcher) unwatchBlocking(b *broker.Blocking) {
	b.Stop()
	if d.Blocked != nil {
		d.Blocked.Set(0)
	}
}

// finishing returns the context what a stop leaves to finish runs on (a
// batch taken, its reschedule, the marks): the end of ctx does not cut it
// short, but stopBound after it, it ends too.
func finishing(ctx context.Context) (context.Context, context.CancelFunc) {
	finish, cancelFinish := context.WithCancel(context.WithoutCancel(ctx))
	stopTimer := context.AfterFunc(ctx, func() { time.AfterFunc(stopBound, cancelFinish) })
	return finish, func() {
		stopTimer()
		cancelFinish()
	}
}

// sending is one session's loop and what it keeps between its turns: the
// handed-over notices published and not marked yet, marked together within
// the mark delay (or at markMax), and always before the session ends.
type sending struct {
	d        *Dispatcher
	pub      *broker.Publisher
	blocking *broker.Blocking
	finish   context.Context // the batches' and the marks' context (finishing)

	unmarked []int64       // sent, not marked
	markDue  *time.Timer   // when unmarked are marked
	delay    time.Duration // the mark delay
	linger   *time.Timer   // the end of the wait for more handed-over notices
}

func (d *Dispatcher) newSending(pub *broker.Publisher, blocking *broker.Blocking, finish context.Context) *sending {
	s := &sending{d: d, pub: pub, blocking: blocking, finish: finish,
		markDue: time.NewTimer(time.Hour), delay: cmp.Or(d.MarkDelay, DefaultMarkDelay), linger: time.NewTimer(time.Hour)}
	s.markDue.Stop()
	s.linger.Stop()
	return s
}

// close marks what is left (bounded: the publishes are done).
func (s *sending) close() {
	if err := s.flush(); err != nil {
		s.d.Log.Warn("outbox dispatcher: notices sent, not marked; sent again after their lease", zap.Error(err))
	}
	s.markDue.Stop()
	s.linger.Stop()
}

// loop takes handed-over notices and polls for due ones until ctx ends or
// a publish or a mark fails.
func (s *sending) loop(ctx context.Context) error {
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		if ctx.Err() != nil { // stopped: no new offer or poll is taken
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.markDue.C:
			if err := s.flush(); err != nil {
				return err
			}
		case nos := <-s.d.Handoff:
			if err := s.offered(ctx, nos); err != nil {
				return err
			}
		case <-poll.C:
			n, err := s.d.dispatchDue(ctx, s.finish, s.pub)
			if err := s.blockedWait(ctx, err); err != nil {
				return err
			}
			if n < s.d.Batch {
				poll.Reset(s.d.Interval)
			} else {
				poll.Reset(0)
			}
		}
	}
}

// offered publishes the notices of nos and of the offers that follow
// within the linger, up to Batch, as one batch, and keeps the sent ones
// to mark.
func (s *sending) offered(ctx context.Context, nos []string) error {
	nos = s.collect(ctx, nos)
	// The batch is not cut short by ctx, only bounded: a stop publishes
	// the notices taken instead of leaving them to their lease.
	s.d.batches.Add(1)
	sent, err := s.d.dispatchOffered(s.finish, s.pub, nos)
	if len(s.unmarked) == 0 && len(sent) > 0 {
		s.markDue.Reset(s.delay)
	}
	if s.unmarked = append(s.unmarked, sent...); len(s.unmarked) >= markMax {
		if ferr := s.flush(); ferr != nil {
			if err == nil {
				err = ferr
			} else { // the batch's own error is the one returned
				s.d.Log.Warn("outbox dispatcher: notices sent, not marked; sent again after their lease", zap.Error(ferr))
			}
		}
	}
	return s.blockedWait(ctx, err)
}

// collect adds to nos the offers that come within the linger, until it
// holds Batch order numbers or ctx ends.
func (s *sending) collect(ctx context.Context, nos []string) []string {
	s.linger.Reset(cmp.Or(s.d.Linger, DefaultLinger))
	defer s.linger.Stop()
	for len(nos) < s.d.Batch {
		select {
		case next := <-s.d.Handoff:
			nos = append(nos, next...)
		case <-s.linger.C:
			return nos
		case <-ctx.Done():
			return nos
		}
	}
	return nos
}

// flush marks the handed-over notices sent so far.
func (s *sending) flush() error {
	s.markDue.Stop()
	err := s.d.markSent(s.finish, s.unmarked)
	s.unmarked = s.unmarked[:0]
	return err
}

// blockedWait returns err, unless it is a publish that failed because the
// broker blocks the connection: then it marks what was sent and waits for
// the alarm to clear on this connection instead of dialing another, which
// the broker would block at its first publish too (and keep). The failed
// notices are sent again: from the poll, after their lease or their
// backoff.
func (s *sending) blockedWait(ctx context.Context, err error) error {
	if err == nil || !s.blocking.Blocked() || !(errors.Is(err, broker.ErrUnconfirmed) ||
		errors.Is(err, broker.ErrNacked) || errors.Is(err, broker.ErrNoChannel)) {
		return err
	}
	if err := s.flush(); err != nil { // the notices confirmed before: marked now, not sent again
		return err
	}
	s.blocking.Wait(ctx)
	return nil
}
