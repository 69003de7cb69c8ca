package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// traceModes reads -trace: off, or sample ratios from 0 to 1
// (off,0.01,1).
func traceModes(s string) ([]string, error) {
	var modes []string
	for _, m := range strings.Split(s, ",") {
		m = strings.TrimSpace(m)
		if m == "off" {
			modes = append(modes, m)
			continue
		}
		r, err := strconv.ParseFloat(m, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("-trace: want off or a sample ratio from 0 to 1, got %q", m)
		}
		modes = append(modes, m)
	}
	return modes, nil
}

// spanSink is an OTLP/HTTP receiver on loopback that decodes each request,
// counts its spans and discards them.
type spanSink struct {
	*httptest.Server
	spans, requests, bytes atomic.Int64
}

func newSpanSink() *spanSink {
	s := &spanSink{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		n := 0
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				n += len(ss.Spans)
			}
		}
		s.spans.Add(int64(n))
		s.requests.Add(1)
		s.bytes.Add(int64(len(b)))
	}))
	return s
}

// traceCost drains o.n payments with the paysvc daemon once per mode and
// round (modes interleaved within a round: a shared machine's weather
// changes between runs), tracing off or exporting to a local receiver at
// each sample ratio, and reports the daemon's CPU per 1,000 payments from
// its process's rusage (start to exit: the stop's last export counts) and
// the median per mode. The messages carry no traceparent: every trace is
// one paysvc starts, so the ratio decides.
func traceCost(ctx context.Context, o *options, modes []string, rounds int, row func(string, float64, string)) error {
	sink := newSpanSink()
	defer sink.Close()
	cpu := map[string][]float64{}
	rate := map[string][]float64{}
	for i := 1; i <= rounds; i++ {
		for _, mode := range modes {
			env := slices.Clone(o.paysvcEnv)
			label := "tracing off"
			if mode != "off" {
				env = append(env, "PAYSVC_TRACE_OTLPENDPOINT="+sink.URL, "PAYSVC_TRACE_SAMPLERATIO="+mode)
				label = "tracing at " + mode
			}
			spans0, reqs0 := sink.spans.Load(), sink.requests.Load()
			m, err := measureDaemon(ctx, o, o.n, 0, env...)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			perK := m.lifeCPU.Seconds() / float64(m.payments) * 1000
			cpu[mode], rate[mode] = append(cpu[mode], perK), append(rate[mode], m.rate)
			row(fmt.Sprintf("round %d: paysvc daemon, %s, %d msgs", i, label, m.msgs), m.rate,
				fmt.Sprintf("%.3f CPU s/1k payments (process rusage, start to exit); %d spans in %d requests received; %s",
					perK, sink.spans.Load()-spans0, sink.requests.Load()-reqs0, m.cost))
		}
	}
	base := median(cpu[modes[0]])
	for _, mode := range modes {
		label := "tracing off"
		if mode != "off" {
			label = "tracing at " + mode
		}
		extra := ""
		if mode != modes[0] && base > 0 {
			extra = fmt.Sprintf(" (%+.0f%% against %s)", (median(cpu[mode])/base-1)*100, modes[0])
		}
		row(fmt.Sprintf("median of %d: paysvc daemon, %s", rounds, label), median(rate[mode]),
			fmt.Sprintf("%.3f CPU s/1k payments%s", median(cpu[mode]), extra))
	}
	return nil
}
