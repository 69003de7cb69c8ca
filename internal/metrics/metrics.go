// Package metrics defines paysvc's Prometheus metrics. One Metrics value is
// made per process and handed to whoever records.
package metrics

import (
	"net/http"
	"regexp"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds every collector, registered on its own registry.
type Metrics struct {
	Registry *prometheus.Registry

	// handling
	Messages      *prometheus.CounterVec // result: FIRST, DUPLICATE, RETRY, TERMINAL, REQUEUE
	Errors        *prometheus.CounterVec // class
	Duration      prometheus.Histogram
	GroupSize     prometheus.Histogram
	TxRetries     prometheus.Counter
	HeldLocked    prometheus.Counter
	Disagreements *prometheus.CounterVec // kind: redis_new_db_applied, redis_done_db_unpaid
	RequeuedAlone prometheus.Counter

	// consumption
	Ready         prometheus.Gauge
	Degraded      prometheus.Gauge
	Paused        prometheus.Gauge
	PauseReason   *prometheus.GaugeVec   // reason: why consumption is paused
	Pauses        *prometheus.CounterVec // class: what paused consumption
	Held          *prometheus.GaugeVec   // dependency: redis, mysql, other, broker (a copy the broker blocks or refuses)
	Reconnects    *prometheus.CounterVec // component: consumer, monitor
	Failovers     *prometheus.CounterVec // component: broker (another node), redis (another master)
	BrokerBlocked *prometheus.GaugeVec   // component: consumer (its retry and terminal copies), outbox

	// queues
	QueueMessages      *prometheus.GaugeVec // queue
	QueueOldestAge     *prometheus.GaugeVec // queue
	RetryCopiesMoved   prometheus.Counter
	RetryCopiesHeld    prometheus.Gauge
	RetryCopiesOverdue prometheus.Gauge

	// dead letters
	TerminalPending  prometheus.Gauge
	ParkFallbacks    prometheus.Counter
	DeadLettersNew   prometheus.Gauge
	DeadLettersClass *prometheus.GaugeVec // class
	AlertFailures    prometheus.Counter

	// outbox
	OutboxPending   prometheus.Gauge
	OutboxOldestAge prometheus.Gauge

	// upkeep
	ReconcileProblems prometheus.Gauge
	ReconcileLastRun  prometheus.Gauge
	LostPayments      prometheus.Gauge
	PrunedRows        *prometheus.CounterVec // table
	PruneLastRun      prometheus.Gauge

	// process
	BuildInfo    *prometheus.GaugeVec   // version, revision, goversion: SetBuild
	SpansDropped *prometheus.CounterVec // reason: queue_full, export_failed

	own []prometheus.Collector
}

var fqName = regexp.MustCompile(`fqName: "([a-z_:]+)"`)

// Names lists the names of paysvc's own metrics, with or without a series
// yet (a vector without labels set has none), for the tests that check
// that alert rules and dashboards query only what paysvc exports.
func (m *Metrics) Names() []string {
	var out []string
	for _, c := range m.own {
		ch := make(chan *prometheus.Desc, 4)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if n := fqName.FindStringSubmatch(d.String()); n != nil {
				out = append(out, n[1])
			}
		}
	}
	return out
}

// New makes and registers the collectors, family by family, with the Go
// and process ones.
func New() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.handling()
	m.consumption()
	m.queues()
	m.deadLetters()
	m.outbox()
	m.upkeep()
	m.process()
	m.Registry.MustRegister(m.own...)
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// SetBuild sets paysvc_build_info: the release and VCS revision the binary
// was built from, and the Go version (one series, at 1).
func (m *Metrics) SetBuild(version, revision string) {
	m.BuildInfo.Reset()
	m.BuildInfo.WithLabelValues(version, revision, runtime.Version()).Set(1)
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}
