package testenv

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on loopback in front of a real server, so a test can
// take the server away from one client (Down) and give it back (Up) without
// touching the shared server.
type Proxy struct {
	t      testing.TB
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	hole  func(toServer []byte) bool
}

// BlackholeWhen makes the proxy black-hole a connection as soon as a chunk
// the client sends matches: that chunk and everything after it, both ways,
// is dropped, and the server's side stays open (no FIN, no reset), as
// behind a dead network path. The server learns nothing until its own
// timeouts fire. Down closes everything.
func (p *Proxy) BlackholeWhen(match func(toServer []byte) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hole = match
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
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(server) {
		client.Close()
		return
	}
	done := make(chan bool, 2)
	go func() { done <- p.forward(server, client) }()
	go func() { io.Copy(client, server); done <- false }()
	if holed := <-done; holed {
		// Keep the server's side open: Down closes it.
		client.Close()
		return
	}
	client.Close()
	server.Close()
}

// forward copies what the client sends to the server until either side
// ends, or, when a chunk matches the black-hole rule, stops and reports true.
func (p *Proxy) forward(server, client net.Conn) bool {
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			p.mu.Lock()
			hole := p.hole
			p.mu.Unlock()
			if hole != nil && hole(buf[:n]) {
				return true
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				return false
			}
		}
		if err != nil {
			return false
		}
	}
}
