package tracing

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/httpjson"
)

// Options configure span export (Start).
type Options struct {
	// Endpoint is trace.otlpEndpoint: an OTLP/HTTP collector's base URL
	// (spans go to Endpoint/v1/traces). Set, it wins over the
	// OTEL_EXPORTER_OTLP_ENDPOINT and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	// variables; empty, they decide.
	Endpoint string
	// SampleRatio is trace.sampleRatio: the share of the traces paysvc
	// starts (messages without a traceparent) that are exported; a message
	// with a traceparent follows its sampled flag. OTEL_TRACES_SAMPLER, if
	// set, replaces it.
	SampleRatio float64
	// Version is service.version (the build's).
	Version string
	Log     *zap.Logger
	// Dropped, if not nil, is told of spans that never reached the
	// collector: reason queue_full (the export queue was full when the
	// span ended) or export_failed (the collector refused the batch or did
	// not answer, retries included).
	Dropped func(reason string, n int)
}

// Drop reasons (Options.Dropped).
const (
	DropQueueFull    = "queue_full"
	DropExportFailed = "export_failed"
)

// Enabled says whether spans are exported: an endpoint is configured
// (trace.otlpEndpoint, or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT in the environment) and neither
// OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none turns it off.
func Enabled(endpoint string) bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") ||
		strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")), "none") {
		return false
	}
	return endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// Tracer starts the spans paysvc exports: the OpenTelemetry SDK with a
// batch span processor and the OTLP/HTTP (protobuf) exporter. A nil Tracer
// exports nothing; its spans still carry the trace context.
type Tracer struct {
	tp *sdktrace.TracerProvider
	tr trace.Tracer
}

// Start builds the exporter when Enabled(o.Endpoint), else returns nil. It
// connects to nothing: a collector that is down costs retries and dropped
// spans, never a payment. The exporter's settings the OTEL_EXPORTER_OTLP_*
// variables give (headers, compression, timeout, TLS files) are the SDK's,
// read from the process's environment, as are OTEL_BSP_* (queue, batch,
// delay) and OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME.
func Start(ctx context.Context, o Options) (*Tracer, error) {
	if !Enabled(o.Endpoint) {
		return nil, nil
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Dropped == nil {
		o.Dropped = func(string, int) {}
	}
	sampler, samplerDesc, err := samplerFromEnv(o.SampleRatio)
	if err != nil {
		return nil, err
	}
	var opts []otlptracehttp.Option
	if o.Endpoint != "" {
		eopts, err := endpointOptions(o.Endpoint)
		if err != nil {
			return nil, err
		}
		opts = append(opts, eopts...)
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %s", httpjson.Redact(err.Error()))
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(ownResource(o.Version)...),
		resource.WithHost(), resource.WithTelemetrySDK(),
		resource.WithFromEnv()) // OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win over the above
	if err != nil {
		if res == nil {
			return nil, fmt.Errorf("trace resource: %w", err)
		}
		o.Log.Warn("trace resource: some attributes left out", zap.Error(err))
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if strings.TrimSpace(os.Getenv(name)) == "grpc" {
			o.Log.Warn("paysvc exports spans over OTLP/HTTP only: "+name+"=grpc is sent as http/protobuf; point the endpoint at the collector's HTTP port (4318)",
				zap.String("variable", name))
		}
	}
	queue := envInt("OTEL_BSP_MAX_QUEUE_SIZE", sdktrace.DefaultMaxQueueSize)
	var inFlight atomic.Int64
	log := o.Log
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", zap.String("error", httpjson.Redact(err.Error())))
	}))
	counted := &countingExporter{SpanExporter: exp, inFlight: &inFlight, dropped: o.Dropped, log: o.Log}
	bsp := sdktrace.NewBatchSpanProcessor(counted, sdktrace.WithMaxQueueSize(queue))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(&gate{SpanProcessor: bsp, limit: int64(queue), inFlight: &inFlight, dropped: o.Dropped, log: o.Log}))
	o.Log.Info("tracing: spans exported over OTLP/HTTP", zap.String("sampler", samplerDesc), zap.Int("queue", queue),
		zap.Bool("endpoint_from_config", o.Endpoint != ""))
	return &Tracer{tp: tp, tr: tp.Tracer("github.com/paysvc/paysvc", trace.WithInstrumentationVersion(o.Version))}, nil
}

// Shutdown exports what is queued and stops, within ctx; a nil Tracer has
// nothing to do.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	if err := t.tp.Shutdown(ctx); err != nil {
		return errors.New(httpjson.Redact(err.Error()))
	}
	return nil
}

// ownResource is what paysvc says about itself: service.name, its version,
// and the pod it runs in when the Kubernetes downward API names it
// (POD_NAME, POD_NAMESPACE).
func ownResource(version string) []attribute.KeyValue {
	kv := []attribute.KeyValue{attribute.String("service.name", "paysvc")}
	if version != "" {
		kv = append(kv, attribute.String("service.version", version))
	}
	for env, key := range map[string]string{"POD_NAME": "k8s.pod.name", "POD_NAMESPACE": "k8s.namespace.name", "NODE_NAME": "k8s.node.name"} {
		if v := strings.TrimSpace(os.Getenv(env)); v != "" {
			kv = append(kv, attribute.String(key, v))
		}
	}
	return kv
}

// endpointOptions point the exporter at trace.otlpEndpoint's /v1/traces.
// A user and password in the URL become a basic Authorization header, added
// to the OTEL_EXPORTER_OTLP_(TRACES_)HEADERS ones (the exporter itself
// would drop them).
func endpointOptions(endpoint string) ([]otlptracehttp.Option, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("trace.otlpEndpoint: want an http:// or https:// URL") // the value is a secret: not shown
	}
	var opts []otlptracehttp.Option
	if u.User != nil {
		pw, _ := u.User.Password()
		h := envHeaders()
		h["Authorization"] = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pw))
		opts = append(opts, otlptracehttp.WithHeaders(h))
		u.User = nil
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	u.RawPath = ""
	return append(opts, otlptracehttp.WithEndpointURL(u.String())), nil
}

// envHeaders reads OTEL_EXPORTER_OTLP_HEADERS, then
// OTEL_EXPORTER_OTLP_TRACES_HEADERS over it (key=value pairs, comma
// separated, values URL-encoded), as the exporter does.
func envHeaders() map[string]string {
	h := map[string]string{}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"} {
		for _, pair := range strings.Split(os.Getenv(name), ",") {
			k, v, ok := strings.Cut(pair, "=")
			if !ok {
				continue
			}
			k = strings.TrimSpace(k)
			if uv, err := url.PathUnescape(strings.TrimSpace(v)); err == nil && k != "" {
				h[k] = uv
			}
		}
	}
	return h
}

// samplerFromEnv is OTEL_TRACES_SAMPLER (with OTEL_TRACES_SAMPLER_ARG) when
// set, else the parent-based ratio sampler of trace.sampleRatio. An unknown
// sampler or a bad ratio is an error: paysvc does not start on a sampling
// it was not asked for.
func samplerFromEnv(ratio float64) (sdktrace.Sampler, string, error) {
	name := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER")))
	if name == "" {
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)),
			fmt.Sprintf("parentbased_traceidratio %g (trace.sampleRatio)", ratio), nil
	}
	arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG"))
	argRatio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: want a ratio from 0 to 1, got %q", arg)
		}
		return r, nil
	}
	desc := "OTEL_TRACES_SAMPLER=" + name
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), desc, nil
	case "always_off":
		return sdktrace.NeverSample(), desc, nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), desc, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), desc, nil
	case "traceidratio", "parentbased_traceidratio":
		r, err := argRatio()
		if err != nil {
			return nil, "", err
		}
		desc += fmt.Sprintf(" %g", r)
		if name == "traceidratio" {
			return sdktrace.TraceIDRatioBased(r), desc, nil
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), desc, nil
	default:
		return nil, "", fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not one of always_on, always_off, traceidratio, "+
			"parentbased_always_on, parentbased_always_off, parentbased_traceidratio", name)
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(strings.TrimSpace(os.Getenv(name))); err == nil && n > 0 {
		return n
	}
	return def
}

// gate stands before the batch span processor and holds the spans in its
// hands (queued, batched or being exported) to its queue size: a span past
// that is dropped here and counted, so the processor's queue is never full
// and never drops one uncounted. A payment never waits for a span.
type gate struct {
	sdktrace.SpanProcessor
	limit    int64
	inFlight *atomic.Int64
	dropped  func(string, int)
	log      *zap.Logger
	lastLog  atomic.Int64 // unix seconds of the last "dropped" line
}

func (g *gate) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	if g.inFlight.Add(1) > g.limit {
		g.inFlight.Add(-1)
		g.dropped(DropQueueFull, 1)
		now := time.Now().Unix()
		if last := g.lastLog.Load(); now-last >= 60 && g.lastLog.CompareAndSwap(last, now) {
			g.log.Warn("span export queue full: spans dropped (paysvc_trace_spans_dropped_total)", zap.Int64("queue", g.limit))
		}
		return
	}
	g.SpanProcessor.OnEnd(s)
}

// countingExporter counts the spans a batch export lost and logs why,
// without the endpoint's path or user (they may hold a token).
type countingExporter struct {
	sdktrace.SpanExporter
	inFlight *atomic.Int64
	dropped  func(string, int)
	log      *zap.Logger
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	e.inFlight.Add(-int64(len(spans)))
	if err != nil {
		e.dropped(DropExportFailed, len(spans))
		e.log.Warn("otlp export failed; spans dropped", zap.Int("spans", len(spans)), zap.String("error", httpjson.Redact(err.Error())))
	}
	return nil // counted and logged here, not again by the SDK's error handler
}

// Kind is a span's kind.
type Kind = trace.SpanKind

// The span kinds paysvc starts.
const (
	KindConsumer = trace.SpanKindConsumer
	KindClient   = trace.SpanKindClient
)

// Span is one span of a message: its Context is what paysvc logs (the
// trace id) and publishes as the parent (traceparent) of what it sends on.
// Without a Tracer, or not sampled, it records nothing.
type Span struct {
	Context Context
	s       trace.Span // nil: no Tracer
}

// Start starts a span at the time at: a child of parent when traced (a
// traceparent the message carried), else the root of a new trace. With a
// nil Tracer it only makes the context (a sampled flag passed on as it
// came; a new trace marked sampled).
func (t *Tracer) Start(parent Context, traced bool, name string, kind Kind, at time.Time) Span {
	if t == nil {
		if traced {
			return Span{Context: parent.Child()}
		}
		return Span{Context: New()}
	}
	ctx := context.Background()
	if traced {
		ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: parent.TraceID, SpanID: parent.SpanID, TraceFlags: trace.TraceFlags(parent.Flags), Remote: true}))
	}
	return t.start(ctx, name, kind, at)
}

// Child starts a span under parent at the time at.
func (t *Tracer) Child(parent Span, name string, kind Kind, at time.Time) Span {
	if t == nil || parent.s == nil {
		return Span{Context: parent.Context.Child()}
	}
	return t.start(trace.ContextWithSpan(context.Background(), parent.s), name, kind, at)
}

func (t *Tracer) start(ctx context.Context, name string, kind Kind, at time.Time) Span {
	_, s := t.tr.Start(ctx, name, trace.WithSpanKind(kind), trace.WithTimestamp(at))
	sc := s.SpanContext()
	return Span{s: s, Context: Context{TraceID: sc.TraceID(), SpanID: sc.SpanID(), Flags: byte(sc.TraceFlags())}}
}

// Recording says whether the span is exported: attributes are worth
// building only then.
func (s Span) Recording() bool { return s.s != nil && s.s.IsRecording() }

// SetAttributes sets attributes on a recording span.
func (s Span) SetAttributes(kv ...attribute.KeyValue) {
	if s.Recording() {
		s.s.SetAttributes(kv...)
	}
}

// End ends the span now; errText, if not empty, sets status ERROR with it.
func (s Span) End(errText string) {
	if s.s == nil {
		return
	}
	if errText != "" && s.s.IsRecording() {
		s.s.SetStatus(codes.Error, errText)
	}
	s.s.End()
}
