package main

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/testenv"
	"github.com/paysvc/paysvc/internal/tracing"
)

// collector is an OTLP/HTTP endpoint (protobuf, as the SDK's exporter
// sends) that keeps the spans it is sent, each as a map: traceId, spanId,
// parentSpanId in hex, name, kind, attributes.
type collector struct {
	mu    sync.Mutex
	spans []map[string]any
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want POST /v1/traces, protobuf", http.StatusBadRequest)
		return
	}
	b, _ := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				attrs := map[string]string{}
				for _, kv := range s.Attributes {
					attrs[kv.Key] = kv.Value.GetStringValue()
				}
				c.spans = append(c.spans, map[string]any{"traceId": hex.EncodeToString(s.TraceId), "spanId": hex.EncodeToString(s.SpanId),
					"parentSpanId": hex.EncodeToString(s.ParentSpanId), "name": s.Name, "kind": s.Kind, "attributes": attrs})
			}
		}
	}
}

func (c *collector) find(match func(map[string]any) bool) map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.spans {
		if match(s) {
			return s
		}
	}
	return nil
}

func attr(s map[string]any, key string) string {
	as, _ := s["attributes"].(map[string]string)
	return as[key]
}

// publishTraced publishes a payment with a producer's traceparent.
func publishTraced(t *testing.T, url string, tc tracing.Context, body []byte) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ch.Confirm(false)
	conf, err := ch.PublishWithDeferredConfirm("", listener.MainQueue, true, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
		Headers: amqp.Table{tracing.Header: tc.String()}})
	if err != nil || !conf.Wait() {
		t.Fatalf("publish: %v", err)
	}
}

// A producer's traceparent travels with its payment: into every log line
// of the message (trace_id), onto the retry copy, the terminal copy and
// its dead letter (t_dead_letter.trace_id), onto the payment's notice; and
// the OTLP collector gets the message's span, a child of the producer's,
// with the database transaction as its child.
func TestTraceContextTravelsWithThePayment(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (31, 100.00), (32, 1.00), (33, 100.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('TR1', 31, 5.00), ('TR2', 32, 5.00), ('TR3', 33, 5.00)")
	_, logs := w.daemonInProcess("PAYSVC_TRACE_OTLPENDPOINT="+srv.URL, "PAYSVC_RETRY_DELAYS=1s")

	paid, short, bad := tracing.New(), tracing.New(), tracing.New()
	publishTraced(t, w.amqpURL, paid, payment("TR1", 31, "5.00"))
	publishTraced(t, w.amqpURL, short, payment("TR2", 32, "5.00"))                            // balance 1.00: a retry
	publishTraced(t, w.amqpURL, bad, []byte(`{"orderNo":"TR3","userId":33,"amount":"6.00"}`)) // mismatch: terminal

	// The notice of TR1, with the payment's trace.
	conn, err := amqp.Dial(w.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	get := func(queue string) (amqp.Delivery, bool) {
		var d amqp.Delivery
		var ok bool
		testenv.Eventually(t, 30*time.Second, func() bool {
			d, ok, _ = ch.Get(queue, true)
			return ok
		}, "nothing in %s", queue)
		return d, ok
	}
	notice, _ := get(outbox.Queue)
	if got, ok := tracing.FromHeaders(notice.Headers); !ok || got.TraceID != paid.TraceID || got.SpanID == paid.SpanID {
		t.Errorf("the notice of TR1: traceparent %v, want trace %s with paysvc's span as parent", notice.Headers[tracing.Header], paid.TraceIDHex())
	}
	// The retry copy of TR2 (the mover holds it in the wait queue until
	// due) comes back and is handled again: its lines carry the trace
	// (checked with every line below) only if the copy carried it.
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, e := range jsonLines(t, logs.String()) {
			if e["order_no"] == "TR2" && e["msg"] == "message handled" && e["attempt"] == float64(2) {
				return true
			}
		}
		return false
	}, "the retry copy of TR2 was not handled again")
	testenv.Eventually(t, 30*time.Second, func() bool {
		return w.count("SELECT COUNT(*) FROM t_dead_letter WHERE order_no = 'TR3' AND trace_id = ?", bad.TraceIDHex()) == 1
	}, "the dead letter of TR3 does not carry its trace id")

	// Every log line that names the orders carries their trace id.
	for no, tc := range map[string]tracing.Context{"TR1": paid, "TR2": short, "TR3": bad} {
		n := 0
		for _, e := range jsonLines(t, logs.String()) {
			if e["order_no"] != no {
				continue
			}
			n++
			if e["trace_id"] != tc.TraceIDHex() {
				t.Errorf("%s: log line %q has trace_id %v, want %s", no, e["msg"], e["trace_id"], tc.TraceIDHex())
			}
		}
		if n == 0 {
			t.Errorf("%s: no log line", no)
		}
	}

	// The spans: the message's, child of the producer's; the transaction's, child of it.
	var process map[string]any
	testenv.Eventually(t, 15*time.Second, func() bool {
		process = col.find(func(s map[string]any) bool {
			return s["traceId"] == paid.TraceIDHex() && attr(s, "paysvc.result") == "FIRST"
		})
		return process != nil
	}, "no span for TR1's message")
	if process["parentSpanId"] != paid.SpanIDHex() || process["kind"] != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Errorf("TR1's span: parent %v kind %v, want the producer's span %s and CONSUMER", process["parentSpanId"], process["kind"], paid.SpanIDHex())
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		return col.find(func(s map[string]any) bool {
			return s["traceId"] == paid.TraceIDHex() && s["parentSpanId"] == process["spanId"] && s["name"] == "paysvc pay"
		}) != nil
	}, "no database span under TR1's message span")
	// The notice names the database transaction that wrote it as its parent.
	noticeParent, _ := tracing.FromHeaders(notice.Headers)
	if col.find(func(s map[string]any) bool {
		return s["name"] == "paysvc pay" && s["spanId"] == noticeParent.SpanIDHex() && s["parentSpanId"] == process["spanId"]
	}) == nil {
		t.Errorf("the notice's parent %s is not TR1's database span", noticeParent.SpanIDHex())
	}
}

// At stop the daemon exports the spans still queued, after the consumer's
// last one: with the batch processor's timer set beyond the test, the
// message's span reaches the collector only through the stop's flush.
// Not parallel: the timer is the SDK's OTEL_BSP_SCHEDULE_DELAY.
func TestSpansAreExportedAtStop(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
	w := newWorld(t)
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	w.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (41, 100.00)")
	w.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES ('TS1', 41, 5.00)")
	logs := &lockedBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	httpAddr := freeAddr(t)
	go func() {
		done <- run(ctx, []string{"run"}, w.env("PAYSVC_HTTP_ADDR="+httpAddr, "PAYSVC_TRACE_OTLPENDPOINT="+srv.URL), logs)
	}()
	testenv.Eventually(t, 20*time.Second, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, "daemon never ready")

	tc := tracing.New()
	publishTraced(t, w.amqpURL, tc, payment("TS1", 41, "5.00"))
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, e := range jsonLines(t, logs.String()) {
			if e["order_no"] == "TS1" && e["msg"] == "message handled" {
				return true
			}
		}
		return false
	}, "TS1 not handled")
	ofTS1 := func(s map[string]any) bool { return s["traceId"] == tc.TraceIDHex() }
	if col.find(ofTS1) != nil {
		t.Fatal("TS1's span was exported before the stop: the test shows nothing")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the daemon did not stop")
	}
	if col.find(ofTS1) == nil {
		t.Errorf("TS1's span was not exported at stop\n%s", logs)
	}
}
