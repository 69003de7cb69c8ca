package idem

import (
	"context"
	"testing"
	"time"
)

// A walk at rate keys a second spaces its SCAN calls of count keys by
// count/rate; rate 0 does not wait.
func TestScanPace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		count, rate int
		want        time.Duration
	}{{1000, 2000, 500 * time.Millisecond}, {20, 20, time.Second}, {1000, 0, 0}, {1000, 100000, 10 * time.Millisecond}} {
		if got := perCall(c.count, c.rate); got != c.want {
			t.Errorf("perCall(%d, %d) = %s, want %s", c.count, c.rate, got, c.want)
		}
	}
	p := pacer{every: 100 * time.Millisecond}
	start := time.Now()
	for range 4 {
		if err := p.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("four calls 100ms apart in %s", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p = pacer{every: time.Hour, last: time.Now()}
	if err := p.wait(ctx); err == nil {
		t.Fatal("a cancelled wait returned nil")
	}
}
