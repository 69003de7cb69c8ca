package tracing

import (
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"
)

// receiver is an OTLP/HTTP collector: it decodes each POST /v1/traces
// (protobuf, gzip or not) and keeps it with its headers. status, if not 0,
// is its answer; hold, if not nil, makes it wait for the channel's close.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []received
	status int
	hold   chan struct{}
}

type received struct {
	header http.Header
	body   *coltracepb.ExportTraceServiceRequest
}

type gotSpan struct {
	*tracepb.Span
	resource map[string]string
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != "POST" || !strings.HasSuffix(req.URL.Path, "/v1/traces") || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want POST .../v1/traces, protobuf", http.StatusNotFound)
		return
	}
	if r.hold != nil {
		<-r.hold
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	msg := &coltracepb.ExportTraceServiceRequest{}
	if err := proto.Unmarshal(b, msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, received{req.Header.Clone(), msg})
	status := r.status
	r.mu.Unlock()
	if status != 0 {
		http.Error(w, "refused", status)
		return
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Write(out)
}

// spans is every span received, with its resource's attributes.
func (r *receiver) spans() []gotSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []gotSpan
	for _, req := range r.reqs {
		for _, rs := range req.body.ResourceSpans {
			res := map[string]string{}
			for _, kv := range rs.GetResource().GetAttributes() {
				res[kv.Key] = kv.Value.GetStringValue()
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					out = append(out, gotSpan{s, res})
				}
			}
		}
	}
	return out
}

func (r *receiver) headers() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []http.Header
	for _, req := range r.reqs {
		out = append(out, req.header)
	}
	return out
}

func (r *receiver) find(traceID [16]byte, name string) *gotSpan {
	for _, s := range r.spans() {
		if hex.EncodeToString(s.TraceId) == hex.EncodeToString(traceID[:]) && s.Name == name {
			return &s
		}
	}
	return nil
}

// clean clears the OTEL_* variables a developer's shell may have set.
func clean(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
		"OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_BSP_MAX_QUEUE_SIZE",
		"POD_NAME", "POD_NAMESPACE", "NODE_NAME"} {
		t.Setenv(k, "")
	}
}

func start(t *testing.T, o Options) *Tracer {
	t.Helper()
	tr, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if tr == nil {
		t.Fatal("tracing is off")
	}
	return tr
}

func stop(t *testing.T, tr *Tracer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, s string) Context {
	c, ok := Parse(s)
	if !ok {
		t.Fatalf("Parse(%q)", s)
	}
	return c
}

// A message's span is exported as a child of the traceparent it came
// with, in that trace, and its database span as the child of it; the ids
// the spans travel on (the traceparent paysvc publishes) are the exported
// ones; a failed span has status ERROR with its message. The resource
// says paysvc, its version, its pod and namespace, and what
// OTEL_RESOURCE_ATTRIBUTES adds; OTEL_EXPORTER_OTLP_HEADERS reach the
// collector, and OTEL_EXPORTER_OTLP_COMPRESSION=gzip compresses.
func TestSpansReachTheCollector(t *testing.T) {
	clean(t)
	r := newReceiver(t)
	t.Setenv("POD_NAME", "paysvc-7d9f-abcde")
	t.Setenv("POD_NAMESPACE", "payments")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme,authorization=Bearer%20s3cr3t")
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
	tr := start(t, Options{Endpoint: r.URL, SampleRatio: 1, Version: "1.2.3"})
	parent := mustParse(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	msg := tr.Start(parent, true, "q.pay.success process", KindConsumer, time.Now())
	db := tr.Child(msg, "paysvc pay", KindClient, time.Now())
	db.End("")
	msg.End("boom")
	stop(t, tr)

	if msg.Context.TraceID != parent.TraceID || msg.Context.SpanID == parent.SpanID || msg.Context.Flags != 1 {
		t.Errorf("the message's context %v is not a sampled child of %v", msg.Context, parent)
	}
	p := r.find(parent.TraceID, "q.pay.success process")
	if p == nil {
		t.Fatalf("no message span in the parent's trace; got %v", r.spans())
	}
	if hex.EncodeToString(p.ParentSpanId) != parent.SpanIDHex() || hex.EncodeToString(p.SpanId) != msg.Context.SpanIDHex() ||
		p.Kind != tracepb.Span_SPAN_KIND_CONSUMER || p.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || p.Status.GetMessage() != "boom" {
		t.Errorf("message span: parent %x id %x kind %v status %v; want parent %s id %s CONSUMER ERROR boom",
			p.ParentSpanId, p.SpanId, p.Kind, p.Status, parent.SpanIDHex(), msg.Context.SpanIDHex())
	}
	d := r.find(parent.TraceID, "paysvc pay")
	if d == nil || hex.EncodeToString(d.ParentSpanId) != msg.Context.SpanIDHex() || hex.EncodeToString(d.SpanId) != db.Context.SpanIDHex() ||
		d.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("database span %v: want the child %s of the message span %s", d, db.Context.SpanIDHex(), msg.Context.SpanIDHex())
	}
	for k, want := range map[string]string{"service.name": "paysvc", "service.version": "1.2.3", "k8s.pod.name": "paysvc-7d9f-abcde",
		"k8s.namespace.name": "payments", "deployment.environment": "staging"} {
		if got := p.resource[k]; got != want {
			t.Errorf("resource %s = %q, want %q (resource %v)", k, got, want, p.resource)
		}
	}
	for _, h := range r.headers() {
		if h.Get("X-Tenant") != "acme" || h.Get("Authorization") != "Bearer s3cr3t" || h.Get("Content-Encoding") != "gzip" {
			t.Errorf("request headers %v: want x-tenant acme, authorization Bearer s3cr3t, gzip", h)
		}
	}
}

// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over what paysvc
// says about itself.
func TestResourceVariablesWin(t *testing.T) {
	clean(t)
	r := newReceiver(t)
	t.Setenv("POD_NAME", "from-downward-api")
	t.Setenv("OTEL_SERVICE_NAME", "paysvc-canary")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=from-otel")
	tr := start(t, Options{Endpoint: r.URL, SampleRatio: 1, Version: "1.2.3"})
	tr.Start(Context{}, false, "s", KindConsumer, time.Now()).End("")
	stop(t, tr)
	got := r.spans()
	if len(got) != 1 {
		t.Fatalf("%d spans", len(got))
	}
	if res := got[0].resource; res["service.name"] != "paysvc-canary" || res["k8s.pod.name"] != "from-otel" || res["service.version"] != "1.2.3" {
		t.Errorf("resource %v: want service.name paysvc-canary, k8s.pod.name from-otel, service.version 1.2.3", res)
	}
}

// A traceparent whose sampled flag is 00 exports nothing, and the copies
// paysvc sends on say 00 too; a sampled one beside it does arrive.
func TestUnsampledParentExportsNothing(t *testing.T) {
	clean(t)
	r := newReceiver(t)
	tr := start(t, Options{Endpoint: r.URL, SampleRatio: 1})
	off := mustParse(t, "00-11111111111111111111111111111111-00f067aa0ba902b7-00")
	on := mustParse(t, "00-22222222222222222222222222222222-00f067aa0ba902b7-01")
	for _, parent := range []Context{off, on} {
		s := tr.Start(parent, true, "q.pay.success process", KindConsumer, time.Now())
		if s.Recording() != (parent.Flags == 1) {
			t.Errorf("parent flag %02x: recording %v", parent.Flags, s.Recording())
		}
		tr.Child(s, "paysvc pay", KindClient, time.Now()).End("")
		s.End("")
		if s.Context.TraceID != parent.TraceID || s.Context.Flags != parent.Flags {
			t.Errorf("context %v: want trace %s with the parent's flag %02x", s.Context, parent.TraceIDHex(), parent.Flags)
		}
	}
	stop(t, tr)
	if r.find(on.TraceID, "q.pay.success process") == nil {
		t.Fatal("the sampled parent's span did not arrive")
	}
	for _, s := range r.spans() {
		if hex.EncodeToString(s.TraceId) == off.TraceIDHex() {
			t.Errorf("span %q of the unsampled trace exported", s.Name)
		}
	}
}

// trace.sampleRatio 0 exports no trace paysvc starts itself; a sampled
// parent's trace is still exported (parent-based).
func TestRatioZeroExportsNoRoot(t *testing.T) {
	clean(t)
	r := newReceiver(t)
	tr := start(t, Options{Endpoint: r.URL, SampleRatio: 0})
	var roots []Span
	for range 50 {
		s := tr.Start(Context{}, false, "q.pay.success process", KindConsumer, time.Now())
		s.End("")
		roots = append(roots, s)
		if s.Context.TraceID == ([16]byte{}) || s.Context.Flags != 0 {
			t.Fatalf("root context %v: want a new trace, not sampled", s.Context)
		}
	}
	parent := mustParse(t, "00-33333333333333333333333333333333-00f067aa0ba902b7-01")
	tr.Start(parent, true, "q.pay.success process", KindConsumer, time.Now()).End("")
	stop(t, tr)
	if r.find(parent.TraceID, "q.pay.success process") == nil {
		t.Fatal("the sampled parent's span did not arrive")
	}
	if n := len(r.spans()); n != 1 {
		t.Errorf("%d spans exported, want only the sampled parent's", n)
	}

	// Ratio 1: every root is exported (the same test, able to fail).
	r1 := newReceiver(t)
	tr = start(t, Options{Endpoint: r1.URL, SampleRatio: 1})
	for range 5 {
		tr.Start(Context{}, false, "q.pay.success process", KindConsumer, time.Now()).End("")
	}
	stop(t, tr)
	if n := len(r1.spans()); n != 5 {
		t.Errorf("ratio 1: %d of 5 root spans exported", n)
	}
}

// OTEL_TRACES_SAMPLER, when set, replaces trace.sampleRatio; a sampler
// paysvc does not know stops it from starting.
func TestOTELSamplerReplacesTheRatio(t *testing.T) {
	clean(t)
	r := newReceiver(t)
	t.Setenv("OTEL_TRACES_SAMPLER", "traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	tr := start(t, Options{Endpoint: r.URL, SampleRatio: 1})
	tr.Start(Context{}, false, "root", KindConsumer, time.Now()).End("")
	// traceidratio is not parent-based: a sampled parent is sampled again, at 0.
	tr.Start(mustParse(t, "00-44444444444444444444444444444444-00f067aa0ba902b7-01"), true, "child", KindConsumer, time.Now()).End("")
	stop(t, tr)
	if n := len(r.spans()); n != 0 {
		t.Errorf("OTEL_TRACES_SAMPLER=traceidratio 0: %d spans exported", n)
	}
	t.Setenv("OTEL_TRACES_SAMPLER", "sometimes")
	if _, err := Start(context.Background(), Options{Endpoint: r.URL, SampleRatio: 1}); err == nil || !strings.Contains(err.Error(), "OTEL_TRACES_SAMPLER") {
		t.Errorf("an unknown sampler: %v", err)
	}
}

// trace.otlpEndpoint wins over OTEL_EXPORTER_OTLP_ENDPOINT; without it the
// variable turns export on and is used; with neither, nothing is exported.
func TestEndpointPrecedence(t *testing.T) {
	clean(t)
	if Enabled("") {
		t.Fatal("tracing on with no endpoint")
	}
	if tr, err := Start(context.Background(), Options{}); tr != nil || err != nil {
		t.Fatalf("Start with no endpoint: %v %v", tr, err)
	}
	own, env := newReceiver(t), newReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", env.URL)
	tr := start(t, Options{Endpoint: own.URL, SampleRatio: 1})
	tr.Start(Context{}, false, "own", KindConsumer, time.Now()).End("")
	stop(t, tr)
	if len(own.spans()) != 1 || len(env.spans()) != 0 {
		t.Errorf("trace.otlpEndpoint set: %d spans to it, %d to OTEL_EXPORTER_OTLP_ENDPOINT; want 1 and 0", len(own.spans()), len(env.spans()))
	}
	tr = start(t, Options{SampleRatio: 1})
	tr.Start(Context{}, false, "env", KindConsumer, time.Now()).End("")
	stop(t, tr)
	if len(env.spans()) != 1 {
		t.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT alone: %d spans to it, want 1", len(env.spans()))
	}
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if Enabled(own.URL) {
		t.Error("OTEL_SDK_DISABLED=true: tracing still on")
	}
}

// Spans past the export queue are dropped, never waited for, and counted:
// what arrives plus what was counted is every span.
func TestQueueFullDropsAreCounted(t *testing.T) {
	clean(t)
	r := newReceiver(t)
	r.hold = make(chan struct{}) // the collector does not answer yet
	t.Setenv("OTEL_BSP_MAX_QUEUE_SIZE", "8")
	var mu sync.Mutex
	dropped := map[string]int{}
	tr := start(t, Options{Endpoint: r.URL, SampleRatio: 1, Dropped: func(reason string, n int) {
		mu.Lock()
		dropped[reason] += n
		mu.Unlock()
	}})
	const total = 100
	began := time.Now()
	for range total {
		tr.Start(Context{}, false, "s", KindConsumer, time.Now()).End("")
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("ending %d spans took %s: they waited for the collector", total, d)
	}
	close(r.hold)
	stop(t, tr)
	mu.Lock()
	defer mu.Unlock()
	got := len(r.spans())
	if dropped[DropQueueFull] == 0 || got+dropped[DropQueueFull] != total || got > 8 {
		t.Errorf("%d spans arrived, %d counted dropped (queue full); want at most 8 and %d in all", got, dropped[DropQueueFull], total)
	}
}

// A batch the collector refuses is counted as dropped and logged without
// the endpoint's user or path, where a token may be; a user and password
// in trace.otlpEndpoint are sent as basic authorization.
func TestExportFailureIsCountedAndHidesTheEndpoint(t *testing.T) {
	clean(t)
	r := newReceiver(t)
	r.status = http.StatusBadRequest // not retried
	core, logs := observer.New(zap.DebugLevel)
	var mu sync.Mutex
	dropped := map[string]int{}
	endpoint := strings.Replace(r.URL, "http://", "http://UsErToKeN:PaSsWoRd@", 1) + "/tenant/PaThToKeN"
	tr := start(t, Options{Endpoint: endpoint, SampleRatio: 1, Log: zap.New(core), Dropped: func(reason string, n int) {
		mu.Lock()
		dropped[reason] += n
		mu.Unlock()
	}})
	for range 3 {
		tr.Start(Context{}, false, "s", KindConsumer, time.Now()).End("")
	}
	stop(t, tr)
	mu.Lock()
	if dropped[DropExportFailed] != 3 {
		t.Errorf("%d spans counted as export_failed, want 3", dropped[DropExportFailed])
	}
	mu.Unlock()
	h := r.headers()
	if len(h) == 0 || h[0].Get("Authorization") != "Basic "+base64.StdEncoding.EncodeToString([]byte("UsErToKeN:PaSsWoRd")) {
		t.Errorf("requests %v: want basic authorization from the endpoint's user", h)
	}
	failed := 0
	for _, e := range logs.All() {
		line := e.Message
		for k, v := range e.ContextMap() {
			line += " " + k + "=" + strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(toString(v), "\n", " "), "\t", " "))
		}
		if strings.Contains(line, "UsErToKeN") || strings.Contains(line, "PaThToKeN") || strings.Contains(line, "PaSsWoRd") {
			t.Errorf("a log line shows the endpoint: %s", line)
		}
		if strings.Contains(e.Message, "export failed") {
			failed++
		}
	}
	if failed == 0 {
		t.Error("the failed export was not logged")
	}
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if e, ok := v.(error); ok {
		return e.Error()
	}
	return ""
}

// Without a Tracer the context still travels: a child of the message's
// traceparent (its flag as it came), or a new sampled trace.
func TestNoTracerCarriesTheContext(t *testing.T) {
	var tr *Tracer
	parent := mustParse(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	s := tr.Start(parent, true, "x", KindConsumer, time.Now())
	if s.Context.TraceID != parent.TraceID || s.Context.SpanID == parent.SpanID || s.Context.Flags != 0 || s.Recording() {
		t.Errorf("child %v of %v", s.Context, parent)
	}
	c := tr.Child(s, "y", KindClient, time.Now())
	if c.Context.TraceID != parent.TraceID || c.Context.SpanID == s.Context.SpanID {
		t.Errorf("grandchild %v of %v", c.Context, s.Context)
	}
	c.End("boom")
	if root := tr.Start(Context{}, false, "x", KindConsumer, time.Now()); root.Context.TraceID == ([16]byte{}) || root.Context.Flags != 1 {
		t.Errorf("root %v", root.Context)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}
