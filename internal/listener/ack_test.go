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
	c.Nack(1500, false, false)
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

// countAcks counts the frames of a channel whose deliveries are all
// outstanding (no check: the ledger's size is what is measured).
type countAcks struct{ single, multiple int }

func (c *countAcks) Ack(tag uint64, multiple bool) error {
	if multiple {
		c.multiple++
	} else {
		c.single++
	}
	return nil
}
func (c *countAcks) Nack(uint64, bool, bool) error { return nil }
func (c *countAcks) Reject(uint64, bool) error     { return nil }

// One delivery held in a worker (an outage, an alarm) stops the floor
// while the channel settles many more after it: the ledger keeps them as
// runs, not one entry each (at thousands of payments a second, a held
// delivery's half hour is millions of tags). When it is settled the floor
// passes them all with one multiple ack.
func TestLedgerStaysSmallBehindAHeldDelivery(t *testing.T) {
	var l ledger
	ch := &countAcks{}
	const n = 200_000
	for tag := uint64(2); tag <= n; tag++ {
		// A nack now and then.
		s := settlement{tag: tag, ack: true}
		if tag%1000 == 0 {
			s = settlement{tag: tag, requeue: true, err: make(chan error, 1)}
		}
		l.add(ch, s)
		if tag%64 == 0 {
			l.flush(ch, true)
		}
	}
	l.flush(ch, true)
	if l.floor != 0 || len(l.held) != 0 || len(l.done) != 1 || l.done[0] != (span{2, n}) {
		t.Fatalf("behind held tag 1: floor %d, %d held, runs %v; want floor 0, nothing held, one run 2-%d",
			l.floor, len(l.held), l.done[:min(len(l.done), 4)], n)
	}
	l.add(ch, settlement{tag: 1, ack: true})
	l.flush(ch, false)
	if l.floor != n || len(l.done) != 0 || ch.multiple != 1 {
		t.Fatalf("after tag 1: floor %d, runs %v, %d multiple acks; want floor %d, no runs, one multiple ack",
			l.floor, l.done, ch.multiple, n)
	}
}

// settle keeps its runs sorted, disjoint and never adjacent, whatever the
// order of the tags.
func TestLedgerRunsWhateverTheOrder(t *testing.T) {
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 1))
		var l ledger
		tags := r.Perm(300)
		want := map[uint64]bool{}
		for _, i := range tags[:200] {
			tag := uint64(i) + 1
			l.settle(tag)
			want[tag] = true
		}
		for i, s := range l.done {
			if s.lo > s.hi || i > 0 && l.done[i-1].hi+1 >= s.lo {
				t.Fatalf("seed %d: runs %v not sorted, disjoint and apart", seed, l.done)
			}
		}
		got := map[uint64]bool{}
		for _, s := range l.done {
			for tag := s.lo; tag <= s.hi; tag++ {
				got[tag] = true
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("seed %d: runs hold %d tags, want the %d settled", seed, len(got), len(want))
		}
	}
}
