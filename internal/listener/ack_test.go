package listener

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// brokerAcks plays the broker's side of basic.ack/nack/reject on one
// channel: it holds the outstanding delivery tags and refuses, as RabbitMQ
// does with a channel error, a settlement of a tag that is not outstanding.
type brokerAcks struct {
	mu          sync.Mutex
	outstanding map[uint64]bool
	acked       map[uint64]bool
	nacked      map[uint64]bool
	frames      int
	errs        []error
}

func newBrokerAcks(n uint64) *brokerAcks {
	b := &brokerAcks{outstanding: map[uint64]bool{}, acked: map[uint64]bool{}, nacked: map[uint64]bool{}}
	for tag := uint64(1); tag <= n; tag++ {
		b.outstanding[tag] = true
	}
	return b
}

func (b *brokerAcks) Ack(tag uint64, multiple bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames++
	if !b.outstanding[tag] {
		b.errs = append(b.errs, fmt.Errorf("ack of unknown delivery tag %d", tag))
		return nil
	}
	for t := range b.outstanding {
		if t == tag || multiple && t < tag {
			delete(b.outstanding, t)
			b.acked[t] = true
		}
	}
	return nil
}

func (b *brokerAcks) Nack(tag uint64, multiple, requeue bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames++
	if multiple || !b.outstanding[tag] {
		b.errs = append(b.errs, fmt.Errorf("nack of %d (multiple %v) not outstanding", tag, multiple))
		return nil
	}
	delete(b.outstanding, tag)
	b.nacked[tag] = true
	return nil
}

func (b *brokerAcks) Reject(tag uint64, requeue bool) error { return b.Nack(tag, false, requeue) }

// Workers settling 2,000 deliveries in a random order, a tenth of them
// nacked, a few held back until the end: every acked tag is acked once,
// every nacked tag nacked, no frame names a tag that is not outstanding
// (a multiple ack never reaches past a delivery a worker still holds), and
// the acks take fewer frames than deliveries.
func TestCoalescerSettlesEachDeliveryAsItsWorkerSaid(t *testing.T) {
	t.Parallel()
	const n = 2000
	b := newBrokerAcks(n)
	c := newCoalescer(b)
	tags := make([]uint64, n)
	for i := range tags {
		tags[i] = uint64(i + 1)
	}
	// Out of order, but near their place, as concurrent workers settle.
	for i := range tags {
		j := min(i+rand.IntN(16), n-1)
		tags[i], tags[j] = tags[j], tags[i]
	}
	nack := func(tag uint64) bool { return tag%10 == 3 }
	held := map[uint64]bool{500: true, 1500: true}
	var wg sync.WaitGroup
	work := make(chan uint64)
	for range 8 {
		wg.Go(func() {
			for tag := range work {
				if nack(tag) {
					c.Nack(tag, false, true)
				} else {
					c.Ack(tag, false)
				}
			}
		})
	}
	for _, tag := range tags {
		if !held[tag] {
			work <- tag
		}
	}
	close(work)
	wg.Wait()
	// The held deliveries are still outstanding, whatever was acked after them.
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.mu.Lock()
		left := len(b.outstanding)
		b.mu.Unlock()
		if left == len(held) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	b.mu.Lock()
	for tag := range held {
		if !b.outstanding[tag] {
			t.Errorf("held delivery %d was settled", tag)
		}
	}
	b.mu.Unlock()
	c.Ack(500, false)
	c.Reject(1500, false)
	c.Close()
	if err := c.Ack(1, false); err == nil {
		t.Error("Ack after Close: nil, want an error")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, err := range b.errs {
		t.Error(err)
	}
	for tag := uint64(1); tag <= n; tag++ {
		switch {
		case nack(tag) || tag == 1500:
			if !b.nacked[tag] || b.acked[tag] {
				t.Errorf("tag %d: acked %v nacked %v, want nacked", tag, b.acked[tag], b.nacked[tag])
			}
		case !b.acked[tag] || b.nacked[tag]:
			t.Errorf("tag %d: acked %v nacked %v, want acked", tag, b.acked[tag], b.nacked[tag])
		}
	}
	acks := b.frames - len(b.nacked)
	t.Logf("%d deliveries: %d ack frames, %d nacks", n, acks, len(b.nacked))
	if acks >= n-len(b.nacked) {
		t.Errorf("%d ack frames for %d acked deliveries: nothing coalesced", acks, n-len(b.nacked))
	}
}

// An ack whose predecessors stay unsettled is not held for long: it is
// written alone after ackDelay.
func TestCoalescerWritesALoneAckAfterTheDelay(t *testing.T) {
	t.Parallel()
	b := newBrokerAcks(3)
	c := newCoalescer(b)
	defer c.Close()
	c.Ack(3, false) // 1 and 2 stay with their workers
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.mu.Lock()
		acked := b.acked[3]
		b.mu.Unlock()
		if acked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ack of 3 was never written")
		}
		time.Sleep(time.Millisecond)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.outstanding[1] || !b.outstanding[2] {
		t.Fatalf("outstanding %v: the ack of 3 settled deliveries before it", b.outstanding)
	}
}

// A session's end cancels the consumer before the workers holding
// messages let go of them (TestStopWhileHoldingReturnsOnce runs the whole
// path; RabbitMQ 3.10 does not show the race this order closes).
func TestStopIntakeCancelsBeforeReleasing(t *testing.T) {
	var order []string
	stopIntake(func() { order = append(order, "cancel") }, func() { order = append(order, "release") })
	if fmt.Sprint(order) != "[cancel release]" {
		t.Fatalf("teardown order %v, want the cancel before the release", order)
	}
}
