package testenv

import (
	"bytes"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Proxy is a TCP proxy on loopback in front of a real server, so a test can
// take the server away from one client (Down) and give it back (Up) without
// touching the shared server, or send new connections to another server
// (SetTarget), as a load balancer does.
type Proxy struct {
	t      testing.TB
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	hole  func(toServer []byte) bool
	after bool // forward the matching chunk before the black hole
	cut   bool // close the connection instead of black-holing it
	seq   int  // connections accepted

	query, with []byte // ReplaceQuery

	replaceMatch func(toServer []byte) bool // ReplaceWhen
	replaceWith  []byte

	hold    func(toServer []byte) (held, rest []byte)
	holdFor time.Duration
	watch   func(conn int, toServer bool, chunk []byte)
}

// BlackholeWhen makes the proxy black-hole a connection as soon as a chunk
// the client sends matches: that chunk and everything after it, both ways,
// is dropped, and the server's side stays open (no FIN, no reset), as
// behind a dead network path. The server learns nothing until its own
// timeouts fire. Down closes everything.
func (p *Proxy) BlackholeWhen(match func(toServer []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hole, p.after, p.cut = match, false, false
}

// BlackholeAfter is BlackholeWhen, except that the matching chunk still
// reaches the server: a request that is carried out, whose reply is lost.
func (p *Proxy) BlackholeAfter(match func(toServer []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hole, p.after, p.cut = match, true, false
}

// CutWhen makes the proxy close a connection, both sides, as soon as a chunk
// the client sends matches; the chunk is not forwarded. The server sees the
// client go away and the client sees the server go away, in the middle of
// whatever the chunk began.
func (p *Proxy) CutWhen(match func(toServer []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hole, p.after, p.cut = match, false, true
}

// SetTarget sends the connections made from now on to target; those made
// before stay where they are.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// ReplaceQuery makes the proxy send the statement with in place of a MySQL
// COM_QUERY whose statement is exactly query, so that the client gets the
// server's answer to another statement, as from a proxy that answers some
// statements itself (ProxySQL answers SELECT CONNECTION_ID() with an id of
// its own).
func (p *Proxy) ReplaceQuery(query, with string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.query, p.with = []byte(query), []byte(with)
}

// ReplaceWhen makes the proxy send the statement with in place of each
// MySQL COM_QUERY (one whole packet in a chunk) that match accepts; nil
// stops it. With a SIGNAL, the client gets the error of a server that
// refuses some statements and answers the others.
func (p *Proxy) ReplaceWhen(match func(toServer []byte) bool, with string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replaceMatch, p.replaceWith = match, []byte(with)
}

// replaceMatching is chunk with its statement replaced by with if it is
// one whole COM_QUERY packet that match accepts.
func replaceMatching(chunk []byte, match func([]byte) bool, with []byte) []byte {
	if match == nil || len(chunk) < 5 || chunk[4] != 3 ||
		int(chunk[0])|int(chunk[1])<<8|int(chunk[2])<<16 != len(chunk)-4 || !match(chunk) {
		return chunk
	}
	n := 1 + len(with)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), chunk[3], 3}, with...)
}

// replace is chunk with its statement replaced (ReplaceQuery) if it is one
// COM_QUERY packet carrying exactly query.
func replace(chunk, query, with []byte) []byte {
	if query == nil || len(chunk) != 5+len(query) || chunk[4] != 3 || !bytes.Equal(chunk[5:], query) {
		return chunk
	}
	n := 1 + len(with)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), chunk[3], 3}, with...)
}

// HoldWhen makes the proxy hold part of what the client sends for d,
// while what the client sends after it goes on to the server: a request
// that reaches the server after requests the client made later, as if it
// had been made later itself. split takes each chunk the client sends and
// returns the part to hold (nil: none) and the rest, forwarded at once.
// Both must be whole protocol messages (AMQP frames: HoldAMQP), or the
// stream is corrupted.
func (p *Proxy) HoldWhen(split func(toServer []byte) (held, rest []byte), d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold, p.holdFor = split, d
}

// Watch has the proxy call fn with each chunk as it forwards it, either
// way; conn numbers the proxied connections from 1, in the order they
// came. fn is called from several goroutines, and must not keep chunk.
func (p *Proxy) Watch(fn func(conn int, toServer bool, chunk []byte)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.watch = fn
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{t: t, target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.Down)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

// Down closes the listener and every proxied connection: clients see their
// connections reset and new ones refused.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

// Up listens again on the same address.
func (p *Proxy) Up() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatalf("proxy up: %v", err)
	}
	p.serve(ln)
}

func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c)
		}
	}()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) pipe(client net.Conn) {
	if !p.track(client) {
		return
	}
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	server, err := net.Dial("tcp", target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(server) {
		client.Close()
		return
	}
	p.mu.Lock()
	p.seq++
	conn := p.seq
	p.mu.Unlock()
	var holed atomic.Bool
	done := make(chan struct{}, 2)
	go func() { p.copy(conn, server, client, &holed, true); done <- struct{}{} }()
	go func() { p.copy(conn, client, server, &holed, false); done <- struct{}{} }()
	<-done
	if holed.Load() {
		return // both sides stay open, silent, until Down
	}
	client.Close()
	server.Close()
}

// copy forwards src to dst until either ends. Once the connection is
// black-holed (a chunk from the client matched), it reads and drops
// everything, both ways, and keeps both sockets open.
func (p *Proxy) copy(conn int, dst, src net.Conn, holed *atomic.Bool, fromClient bool) {
	buf := make([]byte, 64<<10)
	var wmu sync.Mutex // a held chunk is written from a goroutine of its own
	write := func(b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		p.mu.Lock()
		watch := p.watch
		p.mu.Unlock()
		if watch != nil {
			watch(conn, fromClient, b)
		}
		_, err := dst.Write(b)
		return err
	}
	for {
		n, err := src.Read(buf)
		if n > 0 && !holed.Load() {
			forward, chunk := true, buf[:n]
			if fromClient {
				p.mu.Lock()
				hole, after, cut, hold, holdFor := p.hole, p.after, p.cut, p.hold, p.holdFor
				chunk = replace(chunk, p.query, p.with)
				chunk = replaceMatching(chunk, p.replaceMatch, p.replaceWith)
				p.mu.Unlock()
				switch {
				case hole != nil && hole(chunk):
					if cut {
						return // pipe closes both sides
					}
					holed.Store(true)
					forward = after
				case hold != nil:
					if held, rest := hold(chunk); held != nil {
						held = bytes.Clone(held)
						time.AfterFunc(holdFor, func() {
							if !holed.Load() {
								write(held) // a failure is the connection's end, seen by the loop
							}
						})
						chunk = rest
					}
				}
			}
			if forward && len(chunk) > 0 {
				if werr := write(chunk); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return // when holed, pipe closes nothing: Down does
		}
	}
}

// MySQLProxy puts a Proxy before the server of dsn and returns it with the
// same DSN pointed at it.
func MySQLProxy(t testing.TB, dsn string) (*Proxy, string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(t, cfg.Addr)
	cfg.Addr = p.Addr()
	return p, cfg.FormatDSN()
}

// AMQPProxy puts a Proxy before the broker of amqpURL and returns it with
// the same URL pointed at it.
func AMQPProxy(t testing.TB, amqpURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	p := NewProxy(t, u.Host)
	u.Host = p.Addr()
	return p, u.String()
}

// IsAMQPStartOk matches a client chunk that begins with AMQP's
// connection.start-ok (class 10, method 11): the login.
func IsAMQPStartOk(toServer []byte) bool {
	return len(toServer) >= 11 && toServer[0] == 1 && bytes.Equal(toServer[7:11], []byte{0, 10, 0, 11})
}

// IsCommit matches a client chunk carrying a COMMIT statement (COM_QUERY).
func IsCommit(toServer []byte) bool { return bytes.Contains(toServer, []byte("\x03COMMIT")) }

// IsCommitOrKill matches IsCommit's chunks and a KILL statement: black-hole
// both, and a client that gave up on its COMMIT cannot free the server's
// side with its own KILL (sqldb kills a statement whose context ended):
// only the server's timeouts can.
func IsCommitOrKill(toServer []byte) bool {
	return IsCommit(toServer) || bytes.Contains(toServer, []byte("\x03KILL"))
}
