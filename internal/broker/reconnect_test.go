package broker

import (
	"context"
	"errors"
	"testing"
	"time"
)

// fakeTime is a clock that only the test moves, and a wait that passes at
// once, recording each wait asked for.
type fakeTime struct {
	at    time.Time
	waits []time.Duration
}

func (f *fakeTime) now() time.Time { return f.at }

func (f *fakeTime) sleep(ctx context.Context, d time.Duration) bool {
	f.waits = append(f.waits, d)
	return ctx.Err() == nil
}

// inStep reports whether a wait of Backoff is one of a step: between half
// and all of it.
func inStep(wait, step time.Duration) bool { return wait >= step/2 && wait <= step }

// The wait between failed sessions doubles from 100ms up to Max and stays
// there; Ended is told each error with the wait that follows it.
func TestReconnectDoublesUpToMax(t *testing.T) {
	ft := &fakeTime{at: time.Unix(0, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	failed := errors.New("connection refused")
	sessions := 0
	var ended []time.Duration
	r := Reconnect{Max: time.Second, now: ft.now, sleep: ft.sleep,
		Ended: func(err error, wait time.Duration) {
			if err != failed {
				t.Errorf("Ended with %v, want the session's error", err)
			}
			ended = append(ended, wait)
		}}
	err := r.Run(ctx, func(context.Context) error {
		if sessions++; sessions == 8 {
			cancel()
		}
		return failed
	})
	if err != nil {
		t.Fatalf("Run: %v, want nil once ctx ends", err)
	}
	steps := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000}
	if len(ft.waits) != len(steps) || len(ended) != len(steps) {
		t.Fatalf("waits %v, Ended %v: want %d of each (no wait after the session ctx ended in)", ft.waits, ended, len(steps))
	}
	for i, step := range steps {
		if ft.waits[i] != ended[i] {
			t.Errorf("wait %d: slept %s, Ended told %s", i, ft.waits[i], ended[i])
		}
		if !inStep(ft.waits[i], step*time.Millisecond) {
			t.Errorf("wait %d: %s, want between half and all of %s", i, ft.waits[i], step*time.Millisecond)
		}
	}
}

// A session that lasted StableSession is a failure of its own: the wait
// after it is the shortest again, and the series doubles anew from there.
func TestReconnectResetsAfterStableSession(t *testing.T) {
	ft := &fakeTime{at: time.Unix(0, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sessions := 0
	r := Reconnect{Max: 30 * time.Second, now: ft.now, sleep: ft.sleep}
	r.Run(ctx, func(context.Context) error {
		sessions++
		switch sessions {
		case 6:
			ft.at = ft.at.Add(StableSession) // the healthy one
		case 8:
			cancel()
		}
		return errors.New("connection reset")
	})
	steps := []time.Duration{100, 200, 400, 800, 1600, 100, 200}
	if len(ft.waits) != len(steps) {
		t.Fatalf("waits %v, want %d", ft.waits, len(steps))
	}
	for i, step := range steps {
		if !inStep(ft.waits[i], step*time.Millisecond) {
			t.Errorf("wait %d: %s, want between half and all of %s", i, ft.waits[i], step*time.Millisecond)
		}
	}
}

// The end of ctx ends a wait at once, however long, and Run returns nil.
func TestReconnectCancelStopsTheWait(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sessions := 0
	r := Reconnect{Max: time.Hour,
		sleep: func(ctx context.Context, _ time.Duration) bool { return Sleep(ctx, time.Hour) },
		Ended: func(error, time.Duration) { time.AfterFunc(20*time.Millisecond, cancel) }}
	done := make(chan error, 1)
	go func() {
		done <- r.Run(ctx, func(context.Context) error { sessions++; return errors.New("down") })
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run still waiting 5 s after ctx ended")
	}
	if sessions != 1 {
		t.Fatalf("%d sessions, want 1: the wait after the first was cut short", sessions)
	}
}

// A session that ends because ctx ended is not reconnected, nor reported.
func TestReconnectSessionEndedByCtx(t *testing.T) {
	ft := &fakeTime{at: time.Unix(0, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	r := Reconnect{Max: time.Second, now: ft.now, sleep: ft.sleep,
		Stop:  func(err error) error { t.Errorf("Stop asked about %v after ctx ended", err); return nil },
		Ended: func(err error, _ time.Duration) { t.Errorf("Ended told %v after ctx ended", err) }}
	err := r.Run(ctx, func(ctx context.Context) error {
		cancel()
		return ctx.Err()
	})
	if err != nil || len(ft.waits) != 0 {
		t.Fatalf("Run: %v, waits %v; want nil and none", err, ft.waits)
	}
	// Run with ctx already ended runs no session.
	if err := r.Run(ctx, func(context.Context) error { t.Error("session ran"); return nil }); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// An error Stop gives ends Run with it, with no wait and no Ended; an
// error Stop lets through is reconnected.
func TestReconnectStopReturnsFatal(t *testing.T) {
	ft := &fakeTime{at: time.Unix(0, 0)}
	refused := errors.New("access refused")
	sessions, ended := 0, 0
	r := Reconnect{Max: time.Second, now: ft.now, sleep: ft.sleep,
		Stop: func(err error) error {
			if err == refused {
				return err
			}
			return nil
		},
		Ended: func(error, time.Duration) { ended++ }}
	err := r.Run(context.Background(), func(context.Context) error {
		if sessions++; sessions < 3 {
			return errors.New("connection refused")
		}
		return refused
	})
	if err != refused {
		t.Fatalf("Run: %v, want %v", err, refused)
	}
	if sessions != 3 || ended != 2 || len(ft.waits) != 2 {
		t.Fatalf("%d sessions, %d Ended, %d waits; want 3, 2, 2", sessions, ended, len(ft.waits))
	}
}

// Before waits with the loop's backoff: its waits and the reconnects' are
// one series. Its error (ctx ended) ends Run with nil before any session.
func TestReconnectBeforeSharesTheBackoff(t *testing.T) {
	ft := &fakeTime{at: time.Unix(0, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	befores := 0
	r := Reconnect{Max: 30 * time.Second, now: ft.now, sleep: ft.sleep,
		Before: func(ctx context.Context, bo *Backoff) error {
			befores++
			switch befores {
			case 1: // two waits for a dependency
				ft.sleep(ctx, bo.Next())
				ft.sleep(ctx, bo.Next())
			case 2:
				cancel()
				return ctx.Err()
			}
			return nil
		}}
	err := r.Run(ctx, func(context.Context) error { return errors.New("down") })
	if err != nil {
		t.Fatalf("Run: %v, want nil", err)
	}
	steps := []time.Duration{100, 200, 400}
	if len(ft.waits) != len(steps) {
		t.Fatalf("waits %v, want %d", ft.waits, len(steps))
	}
	for i, step := range steps {
		if !inStep(ft.waits[i], step*time.Millisecond) {
			t.Errorf("wait %d: %s, want between half and all of %s", i, ft.waits[i], step*time.Millisecond)
		}
	}

	// Before failing first: no session at all.
	r.Before = func(context.Context, *Backoff) error { return context.Canceled }
	if err := r.Run(context.Background(), func(context.Context) error { t.Error("session ran"); return nil }); err != nil {
		t.Fatalf("Run: %v", err)
	}
}
