package listener

import (
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestRetryPolicyNext(t *testing.T) {
	p := RetryPolicy{Delays: []time.Duration{30 * time.Second, time.Minute, 5 * time.Minute}, MaxAttempts: 5}
	tests := []struct {
		kind      Kind
		count     int
		queue     string
		nextCount int
	}{
		{Retryable, 0, "q.pay.dlx.wait.30s", 1},
		{Retryable, 1, "q.pay.dlx.wait.1m", 2},
		{Retryable, 2, "q.pay.dlx.wait.5m", 3},
		{Retryable, 3, "q.pay.dlx.wait.5m", 4}, // the last delay repeats
		{Retryable, 4, "q.pay.dlx.wait.5m", 5},
		{Retryable, 5, TerminalQueue, 5}, // attempts spent
		{Retryable, 99, TerminalQueue, 99},
		{Terminal, 0, TerminalQueue, 0},
		{Terminal, 3, TerminalQueue, 3},
	}
	for _, tt := range tests {
		q, n := p.next(tt.kind, tt.count)
		if q != tt.queue || n != tt.nextCount {
			t.Errorf("next(%v, %d) = %s, %d; want %s, %d", tt.kind, tt.count, q, n, tt.queue, tt.nextCount)
		}
	}
	if q, _ := (RetryPolicy{Delays: p.Delays, MaxAttempts: 0}).next(Retryable, 0); q != TerminalQueue {
		t.Errorf("maxAttempts 0: %s, want terminal at once", q)
	}
}

func TestRetryPolicyInFlight(t *testing.T) {
	p := RetryPolicy{Delays: []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, MaxAttempts: 5}
	tests := []struct {
		inflight  int
		remaining time.Duration
		queue     string
		ok        bool
	}{
		{0, 500 * time.Millisecond, "q.pay.dlx.wait.1s", true},
		{0, 1500 * time.Millisecond, "q.pay.dlx.wait.2s", true},
		{5, 2 * time.Second, "q.pay.dlx.wait.2s", true},
		{0, 50 * time.Second, "q.pay.dlx.wait.3s", true},  // longer than any delay: the longest
		{0, -time.Millisecond, "q.pay.dlx.wait.1s", true}, // no TTL reported
		{maxInFlightRetries, time.Second, "", false},
	}
	for _, tt := range tests {
		q, ok := p.inFlight(tt.inflight, tt.remaining)
		if q != tt.queue || ok != tt.ok {
			t.Errorf("inFlight(%d, %s) = %s, %v; want %s, %v", tt.inflight, tt.remaining, q, ok, tt.queue, tt.ok)
		}
	}
}

func TestFormatDelay(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * time.Second: "30s", time.Minute: "1m", 5 * time.Minute: "5m", 90 * time.Second: "1m30s",
		time.Hour: "1h", 90 * time.Minute: "1h30m", 1500 * time.Millisecond: "1500ms", 200 * time.Millisecond: "200ms",
	} {
		if got := FormatDelay(d); got != want {
			t.Errorf("FormatDelay(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestFailedCopyHeaders(t *testing.T) {
	now := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	d := amqp.Delivery{Body: []byte(`{}`), MessageId: "m1", Headers: amqp.Table{
		"trace-id": "abc", HeaderRetryCount: int32(1), HeaderFirstFailedAt: "2026-11-30T08:00:00Z"}}
	long := make([]byte, 5000)
	for i := range long {
		long[i] = 'x'
	}
	d.Headers[HeaderRequeueCount] = int32(3)
	c := failedCopy(d, WaitQueue(time.Second), 2, ClassBalance, errors.New(string(long)), now)
	if c.Headers["trace-id"] != "abc" || c.Headers[HeaderRetryCount] != int32(2) ||
		c.Headers[HeaderErrorClass] != "balance_not_enough" || len(c.Headers[HeaderLastError].(string)) != maxErrorText ||
		c.Headers[HeaderFirstFailedAt] != "2026-11-30T08:00:00Z" || c.Headers[HeaderLastFailedAt] != "2026-11-30T09:00:00Z" ||
		c.DeliveryMode != amqp.Persistent || c.MessageId != "m1" ||
		c.Headers[HeaderRoutedTo] != "q.pay.dlx.wait.1s" || c.Headers[HeaderRequeueCount] != nil {
		t.Fatalf("copy %+v", c)
	}
	if d.Headers[HeaderRetryCount] != int32(1) {
		t.Fatal("failedCopy changed the original's headers")
	}
	for _, v := range []any{"7", -3, nil, 2.5} {
		if n := retryCount(amqp.Table{HeaderRetryCount: v}); n != 0 {
			t.Errorf("retryCount(%v) = %d, want 0", v, n)
		}
	}
	if n := retryCount(amqp.Table{HeaderRetryCount: int64(4)}); n != 4 {
		t.Errorf("retryCount(int64 4) = %d", n)
	}
}
