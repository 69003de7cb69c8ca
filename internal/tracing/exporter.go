package tracing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Span is one finished span.
type Span struct {
	Context Context
	Parent  [8]byte // zero: a root span
	Name    string
	Kind    int // OTLP SpanKind: KindClient or KindConsumer
	Start   time.Time
	End     time.Time
	Attrs   map[string]string
	Err     string // not empty: status ERROR with this message
}

// OTLP span kinds used here.
const (
	KindClient   = 3
	KindConsumer = 5
)

// Exporter sends spans to an OTLP/HTTP collector (JSON encoding, POST
// {endpoint}/v1/traces) in batches, from a goroutine of its own. Export
// never blocks a payment: when its buffer is full the span is dropped and
// counted. A nil Exporter drops everything.
type Exporter struct {
	url     string
	client  *http.Client
	log     *zap.Logger
	spans   chan Span
	Dropped atomic.Int64
	done    chan struct{}
}

// NewExporter exports to endpoint (e.g. http://otel-collector:4318).
func NewExporter(endpoint string, log *zap.Logger) *Exporter {
	return &Exporter{url: endpoint + "/v1/traces", client: &http.Client{Timeout: 10 * time.Second}, log: log,
		spans: make(chan Span, 4096), done: make(chan struct{})}
}

// Export queues s.
func (e *Exporter) Export(s Span) {
	if e == nil {
		return
	}
	select {
	case e.spans <- s:
	default:
		e.Dropped.Add(1)
	}
}

// Run sends batches (up to 512 spans, at least once a second) until ctx
// ends, then sends what is queued (within 5 s).
func (e *Exporter) Run(ctx context.Context) {
	defer close(e.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var batch []Span
	flush := func(ctx context.Context) {
		if len(batch) == 0 {
			return
		}
		if err := e.send(ctx, batch); err != nil {
			e.log.Warn("otlp export failed; spans dropped", zap.Int("spans", len(batch)), zap.Error(err))
		}
		batch = batch[:0]
	}
	for {
		select {
		case s := <-e.spans:
			if batch = append(batch, s); len(batch) >= 512 {
				flush(ctx)
			}
		case <-tick.C:
			flush(ctx)
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			for {
				select {
				case s := <-e.spans:
					batch = append(batch, s)
				default:
					flush(fctx)
					return
				}
			}
		}
	}
}

// Wait returns when Run has returned.
func (e *Exporter) Wait() { <-e.done }

type kv struct {
	Key   string            `json:"key"`
	Value map[string]string `json:"value"`
}

func attrs(m map[string]string) []kv {
	out := make([]kv, 0, len(m))
	for k, v := range m {
		out = append(out, kv{Key: k, Value: map[string]string{"stringValue": v}})
	}
	return out
}

// send posts one batch in the OTLP JSON encoding (ids in hex, times as
// decimal strings of Unix nanoseconds).
func (e *Exporter) send(ctx context.Context, batch []Span) error {
	type status struct {
		Code    int    `json:"code"`
		Message string `json:"message,omitempty"`
	}
	type span struct {
		TraceID      string `json:"traceId"`
		SpanID       string `json:"spanId"`
		ParentSpanID string `json:"parentSpanId,omitempty"`
		Name         string `json:"name"`
		Kind         int    `json:"kind"`
		Start        string `json:"startTimeUnixNano"`
		End          string `json:"endTimeUnixNano"`
		Attributes   []kv   `json:"attributes"`
		Status       status `json:"status"`
	}
	spans := make([]span, len(batch))
	for i, s := range batch {
		out := span{TraceID: s.Context.TraceIDHex(), SpanID: s.Context.SpanIDHex(), Name: s.Name, Kind: s.Kind,
			Start: strconv.FormatInt(s.Start.UnixNano(), 10), End: strconv.FormatInt(s.End.UnixNano(), 10),
			Attributes: attrs(s.Attrs), Status: status{Code: 1}}
		if s.Parent != ([8]byte{}) {
			out.ParentSpanID = fmt.Sprintf("%x", s.Parent)
		}
		if s.Err != "" {
			out.Status = status{Code: 2, Message: s.Err}
		}
		spans[i] = out
	}
	body, err := json.Marshal(map[string]any{"resourceSpans": []any{map[string]any{
		"resource":   map[string]any{"attributes": attrs(map[string]string{"service.name": "paysvc"})},
		"scopeSpans": []any{map[string]any{"scope": map[string]string{"name": "paysvc"}, "spans": spans}},
	}}})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", e.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the endpoint may hold a token (trace.otlpEndpoint is a secret): never log it
		}
		return fmt.Errorf("otlp export: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("collector answered %s", resp.Status)
	}
	return nil
}
