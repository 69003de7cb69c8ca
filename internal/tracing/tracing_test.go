package tracing

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
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

// The exporter posts spans in OTLP's JSON encoding, ids in hex, times in
// Unix nanoseconds as strings, status ERROR with the message for a failed
// span; what is queued when it stops is still sent.
func TestExporterPostsOTLPJSON(t *testing.T) {
	bodies := make(chan []byte, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/traces" {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		b, _ := io.ReadAll(r.Body)
		bodies <- b
	}))
	defer srv.Close()
	e := NewExporter(srv.URL, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	go e.Run(ctx)
	parent, child := New(), New()
	child.TraceID = parent.TraceID
	start := time.Unix(1700000000, 5)
	e.Export(Span{Context: child, Parent: parent.SpanID, Name: "q process", Kind: KindConsumer, Start: start,
		End: start.Add(time.Millisecond), Attrs: map[string]string{"paysvc.order_no": "O1"}, Err: "boom"})
	cancel()
	e.Wait()
	var got struct {
		ResourceSpans []struct {
			ScopeSpans []struct {
				Spans []struct {
					TraceID, SpanID, ParentSpanID, Name, StartTimeUnixNano string
					Kind                                                   int
					Status                                                 struct {
						Code    int
						Message string
					}
				}
			}
		}
	}
	select {
	case b := <-bodies:
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing posted")
	}
	s := got.ResourceSpans[0].ScopeSpans[0].Spans[0]
	if s.TraceID != parent.TraceIDHex() || s.SpanID != child.SpanIDHex() || s.ParentSpanID != parent.SpanIDHex() ||
		s.Name != "q process" || s.Kind != KindConsumer || s.StartTimeUnixNano != "1700000000000000005" ||
		s.Status.Code != 2 || s.Status.Message != "boom" {
		t.Fatalf("span %+v", s)
	}
	var nilExporter *Exporter
	nilExporter.Export(Span{}) // a nil exporter drops, never panics
}

// trace.otlpEndpoint is a secret (a collector's token may sit in its user
// or its path): a failed export's error, which is logged, shows neither.
func TestExportErrorHidesTheEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: the export fails
	e := NewExporter("http://UsErToKeN@"+addr+"/tenant/PaThToKeN", zap.NewNop())
	err = e.send(context.Background(), []Span{{Context: New(), Name: "x", Start: time.Now(), End: time.Now()}})
	if err == nil {
		t.Fatal("an export to a closed port succeeded")
	}
	if strings.Contains(err.Error(), "UsErToKeN") || strings.Contains(err.Error(), "PaThToKeN") {
		t.Fatalf("the export error shows the endpoint: %v", err)
	}
}
