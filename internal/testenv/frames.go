package testenv

import (
	"bytes"
	"encoding/binary"
)

// AMQPMethod is an AMQP method as the wire names it: its class and method
// ids.
type AMQPMethod struct{ Class, Method uint16 }

// Methods the tests look for.
var (
	BasicCancel  = AMQPMethod{60, 30}
	BasicDeliver = AMQPMethod{60, 60}
	BasicNack    = AMQPMethod{60, 120}
)

// frameEnd ends every AMQP frame.
const frameEnd = 0xCE

// nextFrame splits the first frame off b: its method (ok only for a
// method frame) and its length; n is 0 while b holds no whole frame.
func nextFrame(b []byte) (m AMQPMethod, method bool, n int) {
	if len(b) < 8 {
		return m, false, 0
	}
	size := int(binary.BigEndian.Uint32(b[3:7]))
	if len(b) < 8+size {
		return m, false, 0
	}
	n = 8 + size
	if b[n-1] != frameEnd {
		return m, false, -1 // not a frame boundary
	}
	if b[0] == 1 && size >= 4 { // a method frame
		m = AMQPMethod{binary.BigEndian.Uint16(b[7:9]), binary.BigEndian.Uint16(b[9:11])}
		return m, true, n
	}
	return m, false, n
}

// HoldAMQP is a split for Proxy.HoldWhen: from a chunk of whole AMQP
// frames it takes the frames of method m to hold, and lets the others
// through, in their order. A chunk that is not whole frames, or has no
// such frame, goes through as it is.
func HoldAMQP(m AMQPMethod) func(chunk []byte) (held, rest []byte) {
	return func(chunk []byte) (held, rest []byte) {
		for b := chunk; len(b) > 0; {
			fm, method, n := nextFrame(b)
			if n <= 0 {
				return nil, chunk
			}
			if method && fm == m {
				held = append(held, b[:n]...)
			} else {
				rest = append(rest, b[:n]...)
			}
			b = b[n:]
		}
		if held == nil {
			return nil, chunk
		}
		return held, rest
	}
}

// AMQPStream reassembles one direction of one AMQP connection from the
// chunks a Proxy forwards (Watch), for a test to see its methods in the
// order they went.
type AMQPStream struct {
	buf  []byte
	lost bool
}

// Feed takes the next chunk and returns the methods of the frames it
// completes.
func (s *AMQPStream) Feed(chunk []byte) []AMQPMethod {
	if s.lost {
		return nil
	}
	s.buf = append(s.buf, chunk...)
	if bytes.HasPrefix(s.buf, []byte("AMQP")) && len(s.buf) >= 8 {
		s.buf = s.buf[8:] // the client's protocol header
	}
	var out []AMQPMethod
	for {
		m, ok, n := nextFrame(s.buf)
		if n == 0 {
			return out
		}
		if n < 0 {
			s.lost = true
			return out
		}
		if ok {
			out = append(out, m)
		}
		s.buf = s.buf[n:]
	}
}

// Lost reports that the stream stopped parsing: what it was fed is not
// AMQP frames (or not from a connection's start).
func (s *AMQPStream) Lost() bool { return s.lost }
