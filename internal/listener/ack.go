package listener

import (
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ackDelay is how long an ack waits for the deliveries before it to be
// settled, so that one basic.ack with multiple=true settles them all; after
// it the ack is sent alone. Short: an unsent ack holds a prefetch slot.
const ackDelay = 2 * time.Millisecond

// coalescer is the Acknowledger of one channel's deliveries. Workers settle
// deliveries out of order; the coalescer writes the channel's settlements
// from one goroutine and, where the acked deliveries are contiguous from
// the lowest unsettled delivery tag, acks them with one frame
// (multiple=true). A multiple ack never reaches past a delivery still in a
// worker's hands: it names the highest tag of a contiguous run of settled
// deliveries. Nacks go at once, alone, and in order with the acks around
// them. Ack returns before the frame is written: a lost ack is a
// redelivery, which the guards answer as a duplicate.
type coalescer struct {
	ch   amqp.Acknowledger
	reqs chan settlement
	quit chan struct{} // Close: flush and stop
	done chan struct{} // closed when run has stopped
	once sync.Once
}

type settlement struct {
	tag     uint64
	ack     bool
	requeue bool       // nack: requeue
	err     chan error // nack: the write's result
}

// newCoalescer starts the coalescer of ch's deliveries; Close flushes and
// stops it.
func newCoalescer(ch amqp.Acknowledger) *coalescer {
	c := &coalescer{ch: ch, reqs: make(chan settlement, 256), quit: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *coalescer) Ack(tag uint64, multiple bool) error {
	if multiple {
		panic("coalescer: multiple acks are the coalescer's own")
	}
	select {
	case <-c.quit:
		return amqp.ErrClosed
	default:
	}
	select {
	case c.reqs <- settlement{tag: tag, ack: true}:
		return nil
	case <-c.done:
		return amqp.ErrClosed
	}
}

func (c *coalescer) Nack(tag uint64, multiple, requeue bool) error {
	if multiple {
		panic("coalescer: multiple nacks are not used")
	}
	return c.wait(settlement{tag: tag, requeue: requeue, err: make(chan error, 1)})
}

// Reject is amqp.Acknowledger's: paysvc returns deliveries with Nack only.
func (c *coalescer) Reject(uint64, bool) error {
	panic("coalescer: rejects are not used")
}

func (c *coalescer) wait(s settlement) error {
	select {
	case c.reqs <- s:
		select {
		case err := <-s.err:
			return err
		case <-c.done: // taken too late: never written
			return amqp.ErrClosed
		}
	case <-c.done:
		return amqp.ErrClosed
	}
}

// Close writes the acks still held and stops the coalescer. A settlement
// after Close is not written (an ack then reads as a redelivery; a nack
// fails with amqp.ErrClosed): the channel is closing, and the broker puts
// its unsettled deliveries back.
func (c *coalescer) Close() {
	c.once.Do(func() { close(c.quit) })
	<-c.done
}

func (c *coalescer) run() {
	defer close(c.done)
	var l ledger
	var timer *time.Timer
	var expired <-chan time.Time
	for {
		select {
		case <-c.quit:
			for {
				select {
				case s := <-c.reqs:
					l.add(c.ch, s)
				default:
					l.flush(c.ch, true)
					return
				}
			}
		case s := <-c.reqs:
			l.add(c.ch, s)
		drain:
			for {
				select {
				case s := <-c.reqs:
					l.add(c.ch, s)
				default:
					break drain
				}
			}
		case <-expired:
			expired = nil
		}
		l.flush(c.ch, false)
		if oldest, ok := l.oldestHeld(); ok && expired == nil {
			wait := max(time.Until(oldest.Add(ackDelay)), 0)
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			expired = timer.C
		}
	}
}

// ledger is the coalescer's state: every delivery tag up to floor is
// settled on the broker; above it, done holds the tags settled on the
// broker as runs, and held the tags acked here and not yet written, with
// the time of their ack. A delivery held long in a worker (an outage, an
// alarm) stops the floor while thousands of others are settled after it:
// as runs, they take room for the gaps between them (at most the channel's
// prefetch), not for each tag.
type ledger struct {
	floor uint64
	done  []span // sorted, disjoint, never adjacent
	held  map[uint64]time.Time
}

// span is the delivery tags lo to hi, both included.
type span struct{ lo, hi uint64 }

// add records s; a nack is written at once.
func (l *ledger) add(ch amqp.Acknowledger, s settlement) {
	if l.held == nil {
		l.held = map[uint64]time.Time{}
	}
	if s.ack {
		l.held[s.tag] = time.Now()
		return
	}
	err := ch.Nack(s.tag, false, s.requeue)
	l.settle(s.tag)
	s.err <- err
}

// settle records tag as settled on the broker.
func (l *ledger) settle(tag uint64) {
	if tag <= l.floor {
		return
	}
	// The first run that ends at or after tag.
	i, _ := slices.BinarySearchFunc(l.done, tag, func(s span, t uint64) int {
		switch {
		case s.hi < t:
			return -1
		case s.lo > t:
			return 1
		}
		return 0
	})
	if i < len(l.done) && l.done[i].lo <= tag {
		return // already in it
	}
	left := i > 0 && l.done[i-1].hi+1 == tag
	right := i < len(l.done) && l.done[i].lo == tag+1
	switch {
	case left && right:
		l.done[i-1].hi = l.done[i].hi
		l.done = slices.Delete(l.done, i, i+1)
	case left:
		l.done[i-1].hi = tag
	case right:
		l.done[i].lo = tag
	default:
		l.done = slices.Insert(l.done, i, span{tag, tag})
	}
}

// flush advances the floor over settled tags, acking the held ones passed
// with one multiple ack, and writes alone the held acks above the floor
// that have waited ackDelay (all of them when final).
func (l *ledger) flush(ch amqp.Acknowledger, final bool) {
	var last uint64 // the highest held ack the floor passed
	for {
		next := l.floor + 1
		if _, ok := l.held[next]; ok {
			l.floor, last = next, next
			delete(l.held, next)
			continue
		}
		if len(l.done) > 0 && l.done[0].lo == next {
			l.floor = l.done[0].hi
			l.done = l.done[1:]
			continue
		}
		break
	}
	if last > 0 {
		ch.Ack(last, true) // an error is a closed channel: redelivered, then duplicates
	}
	now := time.Now()
	var due []uint64
	for tag, at := range l.held {
		if final || now.Sub(at) >= ackDelay {
			due = append(due, tag)
		}
	}
	slices.Sort(due)
	for _, tag := range due {
		ch.Ack(tag, false)
		l.settle(tag)
		delete(l.held, tag)
	}
}

func (l *ledger) oldestHeld() (time.Time, bool) {
	var oldest time.Time
	for _, at := range l.held {
		if oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
	}
	return oldest, !oldest.IsZero()
}
