package broker

import (
	"context"
	"time"
)

// Reconnect is the loop every long-lived broker user runs: a session (dial,
// consume or publish, tear down) again and again until its context ends,
// with a wait between two sessions that doubles up to Max and starts again
// from the shortest after a stable session (Backoff.AfterSession).
type Reconnect struct {
	// Max caps the wait between sessions.
	Max time.Duration
	// Before, if not nil, runs before each session and returns once the
	// session may start (the dependencies it needs answer). It waits with
	// the loop's own backoff, so that its waits and the reconnects' are one
	// series. An error from it is the end of ctx: Run returns nil.
	Before func(ctx context.Context, bo *Backoff) error
	// Stop, if not nil, is asked about each session's error; a non-nil
	// answer ends Run with it (a problem reconnecting cannot fix).
	Stop func(err error) error
	// Ended, if not nil, is told each session's error and the wait before
	// the next session: the caller's log line and metrics.
	Ended func(err error, wait time.Duration)

	// now and sleep are the clock and the wait (tests); nil: the real ones.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) bool
}

// Run runs session until ctx ends, then returns nil; it returns an error
// only when Stop gives one. A session that ends while ctx is still alive
// is followed, after the backoff's wait, by the next; the end of ctx
// during the wait ends Run at once.
func (r Reconnect) Run(ctx context.Context, session func(ctx context.Context) error) error {
	now, sleep := r.now, r.sleep
	if now == nil {
		now = time.Now
	}
	if sleep == nil {
		sleep = Sleep
	}
	bo := Backoff{Max: r.Max}
	for ctx.Err() == nil {
		if r.Before != nil {
			if err := r.Before(ctx, &bo); err != nil {
				return nil // ctx is done
			}
		}
		started := now()
		err := session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if r.Stop != nil {
			if stop := r.Stop(err); stop != nil {
				return stop
			}
		}
		wait := bo.afterLasting(now().Sub(started))
		if r.Ended != nil {
			r.Ended(err, wait)
		}
		if !sleep(ctx, wait) {
			return nil
		}
	}
	return nil
}
