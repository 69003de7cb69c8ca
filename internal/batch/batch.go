// Package batch hands the requests that wait at one moment to one call: the
// shape behind paysvc's grouped transactions, Redis pipelines and trace
// inserts. Nothing waits for a batch to fill; under a light load every batch
// holds one request.
package batch

import (
	"context"
	"sync"
	"sync/atomic"
)

// Collector runs batches of the requests sent to it on a fixed number of
// goroutines.
type Collector[T any] struct {
	reqs    chan T
	quit    chan struct{}
	stop    sync.Once
	wg      sync.WaitGroup
	waiting atomic.Int32
}

// Start starts runners goroutines; each takes a waiting request, then every
// other one waiting, up to max, and calls run with them. run must answer
// each request (the requests carry their own way back).
func Start[T any](runners, max int, run func([]T)) *Collector[T] {
	c := &Collector[T]{reqs: make(chan T), quit: make(chan struct{})}
	for range runners {
		c.wg.Go(func() {
			b := make([]T, 0, max)
			for {
				select {
				case <-c.quit:
					return
				case r := <-c.reqs:
					b = append(b[:0], r)
				}
			fill:
				for len(b) < max {
					select {
					case r := <-c.reqs:
						b = append(b, r)
					default:
						break fill
					}
				}
				run(b)
			}
		})
	}
	return c
}

// Send hands r to a runner and reports whether one took it. It does not
// when the collector is stopped or ctx ends first (err says which: nil when
// stopped); the caller then deals with r itself. A nil collector takes
// nothing.
func (c *Collector[T]) Send(ctx context.Context, r T) (taken bool, err error) {
	if c == nil {
		return false, nil
	}
	c.waiting.Add(1)
	defer c.waiting.Add(-1)
	select {
	case c.reqs <- r:
		return true, nil
	case <-c.quit:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// Waiting is how many Send calls have not been taken yet.
func (c *Collector[T]) Waiting() int { return int(c.waiting.Load()) }

// Stop lets each runner finish its batch and waits for them. Sends after
// Stop are not taken.
func (c *Collector[T]) Stop() {
	c.stop.Do(func() { close(c.quit) })
	c.wg.Wait()
}

// Context is the context a batch runs under: the first request's context,
// bounded by the earliest deadline among all of them (of gives a request's
// context), so that no request waits past its own deadline.
func Context[T any](batch []T, of func(T) context.Context) (context.Context, context.CancelFunc) {
	ctx := of(batch[0])
	deadline, ok := ctx.Deadline()
	for _, r := range batch[1:] {
		if d, has := of(r).Deadline(); has && (!ok || d.Before(deadline)) {
			deadline, ok = d, true
		}
	}
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, deadline)
}
