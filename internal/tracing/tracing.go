// Package tracing carries a W3C trace context (the traceparent header) from
// a payment message into its log lines, the copies paysvc publishes of it
// (retries, the terminal queue), its notice and its dead letter; and, when
// an OTLP endpoint is configured, exports a span per message with the
// database transaction as its child through the OpenTelemetry SDK (otel.go).
package tracing

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
)

// Header is the W3C Trace Context header, as an AMQP header name.
const Header = "traceparent"

// Context is one span's place in a trace.
type Context struct {
	TraceID [16]byte
	SpanID  [8]byte
	Flags   byte // 01: sampled
}

// Parse reads a traceparent value (version 00, or a later version read as
// 00 would be, per the spec); ok is false for anything malformed, an
// all-zero trace or span id among them.
func Parse(s string) (c Context, ok bool) {
	parts := strings.Split(strings.TrimSpace(s), "-")
	if len(parts) < 4 || len(parts[0]) != 2 || parts[0] == "ff" || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return Context{}, false
	}
	if parts[0] == "00" && len(parts) != 4 {
		return Context{}, false
	}
	var version [1]byte
	var flags [1]byte
	for _, f := range []struct {
		dst []byte
		src string
	}{{version[:], parts[0]}, {c.TraceID[:], parts[1]}, {c.SpanID[:], parts[2]}, {flags[:], parts[3]}} {
		if strings.ToLower(f.src) != f.src {
			return Context{}, false
		}
		if _, err := hex.Decode(f.dst, []byte(f.src)); err != nil {
			return Context{}, false
		}
	}
	if c.TraceID == ([16]byte{}) || c.SpanID == ([8]byte{}) {
		return Context{}, false
	}
	c.Flags = flags[0]
	return c, true
}

// Trace and span ids need to be unique, not secret: they come from the
// runtime's per-thread generator (math/rand/v2), with no system call on the
// path of every message.

// New starts a trace: a random trace id and span id, sampled.
func New() Context {
	var c Context
	binary.LittleEndian.PutUint64(c.TraceID[:8], nonZero())
	binary.LittleEndian.PutUint64(c.TraceID[8:], rand.Uint64())
	binary.LittleEndian.PutUint64(c.SpanID[:], nonZero())
	c.Flags = 1
	return c
}

// Child is a new span of the same trace.
func (c Context) Child() Context {
	binary.LittleEndian.PutUint64(c.SpanID[:], nonZero())
	return c
}

// nonZero is a random uint64 other than 0 (an all-zero id is invalid).
func nonZero() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

// String is the traceparent value naming this span as the parent.
func (c Context) String() string {
	return fmt.Sprintf("00-%x-%x-%02x", c.TraceID, c.SpanID, c.Flags)
}

// TraceIDHex is the trace id as logs and t_dead_letter carry it.
func (c Context) TraceIDHex() string { return hex.EncodeToString(c.TraceID[:]) }

// SpanIDHex is the span id in hex.
func (c Context) SpanIDHex() string { return hex.EncodeToString(c.SpanID[:]) }

// FromHeaders reads the traceparent of a message's headers; ok is false
// when there is none or it is malformed (the caller then starts a trace).
func FromHeaders(h map[string]any) (Context, bool) {
	s, _ := h[Header].(string)
	if s == "" {
		return Context{}, false
	}
	return Parse(s)
}
