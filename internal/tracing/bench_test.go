package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
)

// processCPU is the process's user+system CPU so far (rusage): the batch
// processor's and the exporter's goroutines count, not only the loop's.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The tracing work of one message as the consumer does it (its span and
// its database span, the attributes when recorded, the trace id for the
// log), for a message without a traceparent: tracing off, sampled at 1%,
// and at 100% exported over loopback to a receiver that discards (a flush
// every 1,000 messages keeps the queue from dropping). cpu-ns/msg is the
// process's CPU, export included (and the receiver's HTTP handling, which
// a real collector spends elsewhere).
func BenchmarkMessageSpans(b *testing.B) {
	for _, mode := range []struct {
		name  string
		on    bool
		ratio float64
	}{{"off", false, 0}, {"ratio=0.01", true, 0.01}, {"ratio=1", true, 1}} {
		b.Run(mode.name, func(b *testing.B) {
			for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_SAMPLER", "OTEL_SDK_DISABLED"} {
				b.Setenv(k, "")
			}
			ctx := context.Background()
			var tr *Tracer
			if mode.on {
				sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
				defer sink.Close()
				var err error
				if tr, err = Start(ctx, Options{Endpoint: sink.URL, SampleRatio: mode.ratio}); err != nil {
					b.Fatal(err)
				}
				defer tr.Shutdown(ctx)
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			for i := range b.N {
				s := tr.Start(Context{}, false, "q.pay.success process", KindConsumer, time.Now())
				_ = s.Context.TraceIDHex()
				db := tr.Child(s, "paysvc pay", KindClient, time.Now())
				_ = db.Context.String()
				if db.Recording() {
					db.SetAttributes(attribute.String("db.system", "mysql"), attribute.String("paysvc.order_no", "B00000001"))
					db.End("")
				}
				if s.Recording() {
					s.SetAttributes(attribute.String("messaging.system", "rabbitmq"), attribute.String("messaging.destination.name", "q.pay.success"),
						attribute.String("messaging.operation", "process"), attribute.String("paysvc.order_no", "B00000001"),
						attribute.String("paysvc.result", "FIRST"), attribute.String("paysvc.error_class", ""))
					s.End("")
				}
				if tr != nil && i%1000 == 999 {
					tr.tp.ForceFlush(ctx)
				}
			}
			if tr != nil {
				tr.tp.ForceFlush(ctx)
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/msg")
		})
	}
}
