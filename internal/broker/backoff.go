// Package broker holds what every RabbitMQ user in paysvc shares: a
// publisher with confirms and mandatory routing, and the reconnect loop
// with its backoff.
package broker

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff doubles from 100ms up to Max, with jitter.
type Backoff struct {
	Max  time.Duration
	last time.Duration
}

// Next returns the next wait: between half and all of the current step.
func (b *Backoff) Next() time.Duration {
	switch {
	case b.last == 0:
		b.last = 100 * time.Millisecond
	case b.last < b.Max:
		b.last = min(2*b.last, b.Max)
	}
	return b.last/2 + rand.N(b.last/2+1)
}

// Reset starts again from the shortest wait.
func (b *Backoff) Reset() { b.last = 0 }

// StableSession is how long a session must have lasted for its end to be a
// failure of its own, not one more of a series: the wait before the next
// reconnect starts again from the shortest.
const StableSession = time.Minute

// AfterSession returns the wait before reconnecting after a session that
// started at started: the next wait, or the shortest again after a stable
// session. Without it, a long-lived process's every reconnect would wait
// the longest once enough short outages had added up.
func (b *Backoff) AfterSession(started time.Time) time.Duration {
	return b.afterLasting(time.Since(started))
}

// afterLasting is AfterSession for a session that lasted d.
func (b *Backoff) afterLasting(d time.Duration) time.Duration {
	if d >= StableSession {
		b.Reset()
	}
	return b.Next()
}

// Sleep waits d or until ctx ends; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
