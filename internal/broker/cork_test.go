package broker

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// writeCounter is a net.Conn that records its writes.
type writeCounter struct {
	net.Conn
	writes [][]byte
	err    error
	closed bool
}

func (w *writeCounter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

func (w *writeCounter) Close() error { w.closed = true; return nil }

func TestCorkHoldsWritesUntilUncork(t *testing.T) {
	w := &writeCounter{}
	c := &corkConn{Conn: w}
	c.Write([]byte("a"))
	c.cork()
	c.Write([]byte("b"))
	c.Write([]byte("c"))
	if len(w.writes) != 1 {
		t.Fatalf("%d writes while corked, want only the one before", len(w.writes))
	}
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 2 || string(w.writes[1]) != "bc" {
		t.Fatalf("writes %q, want [a bc]", w.writes)
	}
	c.Write([]byte("d"))
	if len(w.writes) != 3 {
		t.Fatalf("writes %q: uncorked, a write goes straight through", w.writes)
	}
	// A corked write past corkFlushAt goes out without waiting for uncork.
	c.cork()
	c.Write(make([]byte, corkFlushAt))
	if len(w.writes) != 4 {
		t.Fatalf("%d writes: a full cork buffer is written at once", len(w.writes))
	}
	c.uncork()
	if len(w.writes) != 4 {
		t.Fatalf("%d writes: an empty uncork writes nothing", len(w.writes))
	}
}

// A held batch that cannot be written is an error on uncork, closes the
// connection (amqp091's reader then ends it, with every confirm still
// awaited), and fails every later write.
func TestCorkWriteFailureClosesTheConnection(t *testing.T) {
	w := &writeCounter{}
	c := &corkConn{Conn: w}
	c.cork()
	c.Write([]byte("held"))
	w.err = io.ErrClosedPipe
	if err := c.uncork(); err != io.ErrClosedPipe {
		t.Fatalf("uncork = %v, want the write's error", err)
	}
	if !w.closed {
		t.Fatal("the connection stayed open after a failed write")
	}
	w.err = nil
	if _, err := c.Write([]byte("later")); err == nil || len(w.writes) != 0 {
		t.Fatalf("a write after the failure = %v (%d written), want the failure", err, len(w.writes))
	}
}
