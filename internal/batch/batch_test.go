package batch

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

type item struct {
	n    int
	done chan int // the size of the batch that ran it
}

// Every request taken is run exactly once; while the only runner is busy,
// the requests that arrive wait and then run together, at most max at once.
func TestCollectorBatchesWaitingRequests(t *testing.T) {
	hold, started := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	ran := map[int]int{}
	c := Start(1, 4, func(b []*item) {
		if b[0].n == 0 {
			close(started)
			<-hold
		}
		mu.Lock()
		for _, it := range b {
			ran[it.n]++
		}
		mu.Unlock()
		for _, it := range b {
			it.done <- len(b)
		}
	})
	defer c.Stop()
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	defer release() // before Stop, which waits for the runner
	first := &item{n: 0, done: make(chan int, 1)}
	if taken, err := c.Send(context.Background(), first); !taken || err != nil {
		t.Fatalf("Send = %v, %v", taken, err)
	}
	<-started // the runner is busy with first alone: the rest must queue
	items := make([]*item, 10)
	var wg sync.WaitGroup
	for i := range items {
		items[i] = &item{n: i + 1, done: make(chan int, 1)}
		wg.Go(func() { c.Send(context.Background(), items[i]) })
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Waiting() != len(items) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d waiting", c.Waiting(), len(items))
		}
		time.Sleep(time.Millisecond)
	}
	release()
	wg.Wait()
	var sizes []int
	for _, it := range items {
		sizes = append(sizes, <-it.done)
	}
	if slices.Max(sizes) != 4 {
		t.Errorf("batch sizes %v: want full batches of 4 (max) for queued requests", sizes)
	}
	for i := range len(items) + 1 {
		if ran[i] != 1 {
			t.Errorf("request %d ran %d times", i, ran[i])
		}
	}
}

// After Stop nothing is taken (the caller runs it itself); a done context
// returns its error without handing the request over; a nil collector takes
// nothing.
func TestCollectorSendNotTaken(t *testing.T) {
	c := Start(2, 4, func(b []*item) {})
	c.Stop()
	c.Stop() // twice is fine
	if taken, err := c.Send(context.Background(), &item{}); taken || err != nil {
		t.Errorf("Send after Stop = %v, %v; want not taken, no error", taken, err)
	}
	release := make(chan struct{})
	busy := Start(1, 1, func(b []*item) { <-release })
	defer busy.Stop()
	defer close(release)
	busy.Send(context.Background(), &item{}) // occupies the only runner
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if taken, err := busy.Send(ctx, &item{}); taken || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Send with a done context = %v, %v; want not taken, DeadlineExceeded", taken, err)
	}
	var none *Collector[*item]
	if taken, err := none.Send(context.Background(), &item{}); taken || err != nil {
		t.Errorf("nil collector Send = %v, %v", taken, err)
	}
}

// A batch runs under the earliest deadline among its requests, and ends
// when the first request's context ends.
func TestContextTakesTheEarliestDeadline(t *testing.T) {
	now := time.Now()
	first, cancelFirst := context.WithCancel(context.Background())
	late, c1 := context.WithDeadline(context.Background(), now.Add(time.Hour))
	defer c1()
	early, c2 := context.WithDeadline(context.Background(), now.Add(time.Minute))
	defer c2()
	ctx, cancel := Context([]context.Context{first, late, early, context.Background()},
		func(c context.Context) context.Context { return c })
	defer cancel()
	if d, ok := ctx.Deadline(); !ok || !d.Equal(now.Add(time.Minute)) {
		t.Fatalf("deadline %v, %v; want the earliest, %v", d, ok, now.Add(time.Minute))
	}
	cancelFirst()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the batch's context outlived the first request's")
	}
	none, cancelNone := Context([]context.Context{context.Background()}, func(c context.Context) context.Context { return c })
	defer cancelNone()
	if _, ok := none.Deadline(); ok {
		t.Fatal("a deadline from requests that have none")
	}
}
