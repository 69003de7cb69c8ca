package broker

import (
	"context"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Blocking follows a connection's connection.blocked and
// connection.unblocked: a resource alarm (memory or disk), during which the
// broker reads nothing more from a connection that publishes, acks
// included. RabbitMQ tells a connection when it publishes during an alarm,
// not before: a publish that fails on a blocked connection is the first
// sign. What was sent before the block is read, and may be stored, once the
// alarm clears.
type Blocking struct {
	mu    sync.Mutex
	clear chan struct{} // closed while the connection is not blocked

	callMu  sync.Mutex // held around each call of changed, and by Stop
	stopped bool
}

// WatchBlocking follows conn's notifications; changed, if not nil, is called
// on every change the broker notifies (active: blocked), until Stop. When
// conn closes while blocked, Blocked reads false (nothing waits on it any
// more) without a call: the close may come late, after the caller's next
// connection was blocked, and a gauge set then would lie about that one.
func WatchBlocking(conn *amqp.Connection, changed func(active bool, reason string)) *Blocking {
	return watch(conn.NotifyBlocked(make(chan amqp.Blocking, 4)), changed)
}

func watch(notes <-chan amqp.Blocking, changed func(active bool, reason string)) *Blocking {
	b := &Blocking{clear: make(chan struct{})}
	close(b.clear)
	go func() {
		for n := range notes { // closed with the connection
			if b.set(n.Active) && changed != nil {
				b.callMu.Lock()
				if !b.stopped {
					changed(n.Active, n.Reason)
				}
				b.callMu.Unlock()
			}
		}
		b.set(false)
	}()
	return b
}

// Stop ends the calls of changed: when it returns, none runs and none will.
// A session calls it before it resets what changed sets (a gauge): a
// notification still buffered when the session ended would otherwise set
// the gauge after the reset, for a connection that is gone.
func (b *Blocking) Stop() {
	b.callMu.Lock()
	b.stopped = true
	b.callMu.Unlock()
}

// set records the state and reports whether it changed.
func (b *Blocking) set(active bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.clear: // not blocked
		if active {
			b.clear = make(chan struct{})
			return true
		}
	default: // blocked
		if !active {
			close(b.clear)
			return true
		}
	}
	return false
}

// Blocked reports whether the broker blocks the connection now.
func (b *Blocking) Blocked() bool {
	select {
	case <-b.cleared():
		return false
	default:
		return true
	}
}

func (b *Blocking) cleared() chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.clear
}

// Wait waits until the connection is not blocked; false when ctx ends first.
func (b *Blocking) Wait(ctx context.Context) bool {
	select {
	case <-b.cleared():
		return true
	case <-ctx.Done():
		return false
	}
}
