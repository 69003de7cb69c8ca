package tracing

import (
	"testing"
)

func TestParse(t *testing.T) {
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	c, ok := Parse(good)
	if !ok || c.String() != good || c.TraceIDHex() != "4bf92f3577b34da6a3ce929d0e0e4736" || c.SpanIDHex() != "00f067aa0ba902b7" || c.Flags != 1 {
		t.Fatalf("Parse(%q) = %+v, %v", good, c, ok)
	}
	if c, ok := Parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra"); !ok || c.Flags != 0 {
		t.Errorf("a later version with more fields should be read as 00: %+v %v", c, ok)
	}
	for _, bad := range []string{
		"", "garbage", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero span id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // forbidden version
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
		"00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
	} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	n := New()
	child := n.Child()
	if child.TraceID != n.TraceID || child.SpanID == n.SpanID {
		t.Errorf("Child: %v of %v", child, n)
	}
	if back, ok := Parse(n.String()); !ok || back != n {
		t.Errorf("a new context does not survive its own traceparent: %v", n)
	}
	if _, ok := FromHeaders(map[string]any{Header: 42}); ok {
		t.Error("a traceparent that is not a string was accepted")
	}
}
