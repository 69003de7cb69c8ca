package broker

import (
	"testing"
	"time"
)

// After a series of short sessions the wait reaches the longest; a stable
// session's end starts again from the shortest.
func TestBackoffAfterSession(t *testing.T) {
	b := Backoff{Max: 30 * time.Second}
	short := time.Now()
	for range 12 {
		b.AfterSession(short)
	}
	if w := b.AfterSession(short); w < 15*time.Second {
		t.Fatalf("after 13 short sessions: %s, want at least half of the longest", w)
	}
	if w := b.AfterSession(time.Now().Add(-StableSession)); w > 100*time.Millisecond {
		t.Fatalf("after a stable session: %s, want the shortest wait again", w)
	}
	if w := b.AfterSession(time.Now()); w > 200*time.Millisecond {
		t.Fatalf("the next short session after it: %s, want the second step", w)
	}
}
