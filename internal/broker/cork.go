package broker

import (
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// corkConn is the TCP connection under an AMQP connection. amqp091 writes
// every publish to the socket on its own (one write, one TCP segment, one
// wake-up of the broker's reader per message); while corked, corkConn keeps
// the writes in memory and sends them in one write on uncork. PublishBatch
// corks around its publishes: a batch of notices leaves in one write
// instead of one per notice. Uncorked, writes go straight through.
type corkConn struct {
	net.Conn

	mu     sync.Mutex
	corked bool
	buf    []byte
	err    error // a failed write: every later write fails with it
}

// corkFlushAt is how much a corked connection holds before it writes
// anyway: a batch of large messages is not held in memory whole.
const corkFlushAt = 64 << 10

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.corked {
		n, err := c.Conn.Write(p)
		c.fail(err)
		return n, err
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) >= corkFlushAt {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// cork holds writes until uncork.
func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork writes what was held. An error means some of it may not have
// reached the broker: the connection is closed (its reader then ends it,
// and with it every publish waiting for a confirm).
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	if c.err != nil {
		return c.err
	}
	return c.flushLocked()
}

func (c *corkConn) flushLocked() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if cap(c.buf) > 4*corkFlushAt {
		c.buf = nil // one huge batch does not pin its buffer for good
	}
	c.fail(err)
	return err
}

// fail remembers a write error and closes the socket: a write that failed
// half way leaves the stream unusable.
func (c *corkConn) fail(err error) {
	if err != nil && c.err == nil {
		c.err = err
		c.Conn.Close()
	}
}

// corks maps each connection Dial made to its corkConn.
var corks sync.Map // *amqp.Connection → *corkConn

// corkingDial dials as amqp.DefaultDial(timeout) does and keeps the
// connection in *into. amqp091 puts TLS, for amqps://, over it: corked,
// the records of a batch leave together too.
func corkingDial(timeout time.Duration, into **corkConn) func(network, addr string) (net.Conn, error) {
	dial := amqp.DefaultDial(timeout)
	return func(network, addr string) (net.Conn, error) {
		conn, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		c := &corkConn{Conn: conn}
		*into = c
		return c, nil
	}
}

// register makes conn's corkConn findable (corkOf) while conn is open.
func register(conn *amqp.Connection, c *corkConn) {
	corks.Store(conn, c)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		<-closed
		corks.Delete(conn)
	}()
}

// corkOf is conn's corkConn, or nil for a connection Dial did not make.
func corkOf(conn *amqp.Connection) *corkConn {
	if c, ok := corks.Load(conn); ok {
		return c.(*corkConn)
	}
	return nil
}
