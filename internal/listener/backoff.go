package listener

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff doubles from 100ms up to max, with jitter.
type backoff struct {
	max  time.Duration
	last time.Duration
}

func (b *backoff) next() time.Duration {
	switch {
	case b.last == 0:
		b.last = 100 * time.Millisecond
	case b.last < b.max:
		b.last = min(2*b.last, b.max)
	}
	return b.last/2 + rand.N(b.last/2+1)
}

func (b *backoff) reset() { b.last = 0 }

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
