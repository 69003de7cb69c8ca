package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A notification still buffered when a session stops watching never reaches
// its callback: the session's gauge, reset at its end, stays reset. Blocked
// still follows the connection.
func TestBlockingStopEndsTheCalls(t *testing.T) {
	notes := make(chan amqp.Blocking, 4)
	var mu sync.Mutex
	var calls []bool
	b := watch(notes, func(active bool, _ string) {
		mu.Lock()
		calls = append(calls, active)
		mu.Unlock()
	})
	notes <- amqp.Blocking{Active: true, Reason: "memory"}
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 1 })
	notes <- amqp.Blocking{Active: false}
	waitFor(t, func() bool { return !b.Blocked() })
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(calls) == 2 })

	b.Stop()
	notes <- amqp.Blocking{Active: true, Reason: "memory"}
	waitFor(t, b.Blocked)
	close(notes) // the goroutine ends: every call it would make is made
	waitFor(t, func() bool { return !b.Blocked() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if !b.Wait(ctx) {
		t.Fatal("Wait after the connection closed: still blocked")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 || calls[0] != true || calls[1] != false {
		t.Fatalf("calls %v, want [true false]: a notification after Stop reached the callback", calls)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}
