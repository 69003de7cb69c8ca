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

	Messages           *prometheus.CounterVec // result: FIRST, DUPLICATE, RETRY, TERMINAL, REQUEUE
	Errors             *prometheus.CounterVec // class
	Duration           prometheus.Histogram
	GroupSize          prometheus.Histogram
	TxRetries          prometheus.Counter
	HeldLocked         prometheus.Counter
	Disagreements      *prometheus.CounterVec // kind: redis_new_db_applied, redis_done_db_unpaid
	Degraded           prometheus.Gauge
	Ready              prometheus.Gauge
	Reconnects         *prometheus.CounterVec // component: consumer, monitor
	Pauses             *prometheus.CounterVec // class: what paused consumption
	Failovers          *prometheus.CounterVec // component: broker (another node), redis (another master)
	Paused             prometheus.Gauge
	PauseReason        *prometheus.GaugeVec // reason: why consumption is paused
	RequeuedAlone      prometheus.Counter
	RetryCopiesMoved   prometheus.Counter
	RetryCopiesHeld    prometheus.Gauge
	RetryCopiesOverdue prometheus.Gauge
	ParkFallbacks      prometheus.Counter
	QueueMessages      *prometheus.GaugeVec // queue
	QueueOldestAge     *prometheus.GaugeVec // queue
	TerminalPending    prometheus.Gauge
	DeadLettersNew     prometheus.Gauge
	OutboxPending      prometheus.Gauge
	OutboxOldestAge    prometheus.Gauge
	ReconcileProblems  prometheus.Gauge
	ReconcileLastRun   prometheus.Gauge
	LostPayments       prometheus.Gauge
	PrunedRows         *prometheus.CounterVec // table
	PruneLastRun       prometheus.Gauge
	AlertFailures      prometheus.Counter
	SpansDropped       *prometheus.CounterVec // reason: queue_full, export_failed
	Held               *prometheus.GaugeVec   // dependency: redis, mysql, other, broker (a copy the broker blocks or refuses)
	DeadLettersClass   *prometheus.GaugeVec   // class
	BrokerBlocked      *prometheus.GaugeVec   // component: consumer (its retry and terminal copies), outbox
	BuildInfo          *prometheus.GaugeVec   // version, revision, goversion: SetBuild

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

// New makes and registers the collectors, with the Go and process ones.
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paysvc_messages_total", Help: "Payment messages handled, by result."}, []string{"result"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paysvc_errors_total", Help: "Failed handlings, by error class."}, []string{"class"}),
		Duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "paysvc_handle_duration_seconds", Help: "Time from delivery to broker action.",
			// Up to the handling bound (idempotent.lease/2, 30 s by
			// default) and past it: a message held through an outage.
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}),
		GroupSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "paysvc_pay_group_size", Help: "Payments per database transaction (mysql.groupSize caps it).",
			Buckets: []float64{1, 2, 4, 6, 8, 10, 15, 20, 30, 50, 75, 100}}), // mysql.groupSize: 100 at most
		TxRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paysvc_tx_retries_total",
			Help: "Payment transactions (single or grouped) run again after a deadlock or a lost connection."}),
		HeldLocked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paysvc_pay_held_locked_total",
			Help: "Payments kept out of grouped transactions because their account or order row was found locked by another transaction (each waited alone, one per account at a time, or was answered at once as a lock wait timeout)."}),
		Disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paysvc_guard_disagreements_total",
			Help: "Times Redis and the database disagreed: redis_new_db_applied (Redis said new, the database had applied it), redis_done_db_unpaid, redis_foreign_db_unpaid (a value paysvc does not write at the key, a hand-written consumer's; the database decided)."},
			[]string{"kind"}),
		Degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_degraded", Help: "1 while payments go on without the Redis guard (redisFallback=OPEN)."}),
		Ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_ready", Help: "1 while the consumer is consuming."}),
		Reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paysvc_reconnects_total", Help: "Broker sessions that ended and were started again."}, []string{"component"}),
		Pauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paysvc_pauses_total", Help: "Times consumption paused because a dependency was down, by the error class that showed it."},
			[]string{"class"}),
		Failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paysvc_failovers_total",
			Help: "Times paysvc found itself on another broker node (broker) or Redis master (redis) than before."}, []string{"component"}),
		Paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_paused", Help: "1 while consumption is paused on a dependency that is down (messages held, not returned)."}),
		PauseReason: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paysvc_pause_reason",
			Help: "1 for the reason consumption is paused (mysql_unavailable, mysql_read_only, mysql_writes_stalled: MySQL answers reads but does not commit writes, mysql_error, mysql_node_not_ready: a Galera node that is not Synced, redis_unavailable), 0 for the others."},
			[]string{"reason"}),
		RetryCopiesMoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paysvc_retry_copies_moved_total",
			Help: "Retry copies the mover took from a wait queue when due and published to the main queue (confirmed)."}),
		RetryCopiesHeld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_retry_copies_held",
			Help: "Retry copies the mover holds from the wait queues until they are due (unacked: queue depths do not count them)."}),
		RetryCopiesOverdue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_retry_copies_overdue",
			Help: "Retry copies published to a wait queue and not back by their delay plus a margin (the delay, a minute at least): stranded by the broker's dead-letter worker, or nothing brings them back (the retry ledger in Redis; shared by the replicas)."}),
		RequeuedAlone: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paysvc_requeued_alone_total",
			Help: "Messages sent back to the main queue alone, without an attempt (outcome unknown or timed out while every dependency answered)."}),
		ParkFallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paysvc_park_fallbacks_total",
			Help: "Terminal messages the dead-letter table refused as they came, parked with their body alone (class unparkable)."}),
		QueueMessages: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paysvc_queue_messages", Help: "Ready messages in each queue (passive declare)."}, []string{"queue"}),
		QueueOldestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paysvc_queue_oldest_message_age_seconds", Help: "Age of the oldest message in the main, wait and terminal queues (0 when empty; at most this old: measured without reading the queue)."},
			[]string{"queue"}),
		TerminalPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_terminal_pending", Help: "Terminal messages not dealt with: in q.pay.dlx.terminal and its overflow queue, in this process's parker's hands (taken, not yet parked), and NEW dead letters."}),
		DeadLettersNew: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_dead_letters_new", Help: "Dead letters in status NEW."}),
		OutboxPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_outbox_pending", Help: "Payment notices not yet published."}),
		OutboxOldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_outbox_oldest_pending_age_seconds",
			Help: "Age of the oldest payment notice not yet published (0: none); the same in every replica, read from the database."}),
		ReconcileProblems: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_reconcile_problems", Help: "Orders and accounts the last scheduled reconciliation found problems with (an order once, however many checks it fails)."}),
		ReconcileLastRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_reconcile_last_run_timestamp_seconds", Help: "When the last scheduled reconciliation finished (Unix time; 0: none yet)."}),
		PrunedRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paysvc_pruned_rows_total",
			Help: "Rows the daemon's scheduled prune (prune.interval) deleted, by table: t_outbox, t_payment_event, t_admin_session, t_dead_letter."}, []string{"table"}),
		PruneLastRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_prune_last_run_timestamp_seconds", Help: "When this instance's last scheduled prune finished without error (Unix time; 0: none yet)."}),
		LostPayments: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paysvc_lost_payments",
			Help: "Payments paysvc applied that the database does not have (their Redis guard key says done, the order is INIT or missing: a failover or restore lost the commit), found by the last walk of the keys (reconcile.lostSweepRate), or so far in the walk under way when more."}),
		Held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paysvc_held_messages", Help: "Messages workers hold while consumption is paused, by the dependency that is down (0: not paused on it); broker: messages whose retry or terminal copy the broker blocks (resource alarm) or refuses (nack), held until it takes it."},
			[]string{"dependency"}),
		DeadLettersClass: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paysvc_dead_letters_new_by_class", Help: "Dead letters in status NEW, by error class."}, []string{"class"}),
		AlertFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paysvc_alert_webhook_failures_total", Help: "Rounds of dead-letter alerts the webhook refused or did not answer."}),
		SpansDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paysvc_trace_spans_dropped_total",
			Help: "Sampled spans that never reached the OTLP collector: queue_full (the export queue was full when the span ended), export_failed (the collector refused the batch or did not answer, retries included)."},
			[]string{"reason"}),
		BrokerBlocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paysvc_broker_blocked",
			Help: "1 while the broker blocks a connection paysvc publishes on (a memory or disk alarm): consumer (retry and terminal copies; the messages that need one are held), outbox (notices)."},
			[]string{"component"}),
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "paysvc_build_info",
			Help: "1, labelled with the release (the VERSION file), the VCS revision and the Go version the binary was built from."},
			[]string{"version", "revision", "goversion"}),
	}
	m.own = []prometheus.Collector{m.Messages, m.Errors, m.Duration, m.GroupSize, m.TxRetries, m.HeldLocked, m.Disagreements, m.Degraded, m.Ready, m.Reconnects,
		m.Pauses, m.Failovers, m.Paused, m.PauseReason, m.RequeuedAlone, m.RetryCopiesMoved, m.RetryCopiesHeld, m.RetryCopiesOverdue, m.ParkFallbacks,
		m.QueueMessages, m.QueueOldestAge, m.TerminalPending, m.DeadLettersNew, m.OutboxPending, m.OutboxOldestAge, m.ReconcileProblems,
		m.ReconcileLastRun, m.LostPayments, m.PrunedRows, m.PruneLastRun, m.AlertFailures, m.SpansDropped, m.Held, m.DeadLettersClass, m.BrokerBlocked, m.BuildInfo}
	r.MustRegister(m.own...)
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every known series from the start, at 0: an alert on increase() sees
	// the first event, and a dashboard has a line before anything happened.
	for _, res := range []string{"FIRST", "DUPLICATE", "RETRY", "TERMINAL", "REQUEUE"} {
		m.Messages.WithLabelValues(res)
	}
	for _, kind := range []string{"redis_new_db_applied", "redis_done_db_unpaid", "redis_foreign_db_unpaid"} {
		m.Disagreements.WithLabelValues(kind)
	}
	for _, c := range []string{"consumer", "monitor", "mover"} {
		m.Reconnects.WithLabelValues(c)
	}
	for _, d := range []string{"redis", "mysql", "other", "broker"} {
		m.Held.WithLabelValues(d)
	}
	for _, c := range []string{"consumer", "outbox"} {
		m.BrokerBlocked.WithLabelValues(c)
	}
	for _, table := range []string{"t_outbox", "t_payment_event", "t_admin_session", "t_dead_letter"} {
		m.PrunedRows.WithLabelValues(table)
	}
	for _, r := range []string{"queue_full", "export_failed"} {
		m.SpansDropped.WithLabelValues(r)
	}
	// The ages the monitor samples (listener.MainQueue, TerminalQueue; the
	// wait queues', named by the configured delays, on its first sample).
	for _, q := range []string{"q.pay.success", "q.pay.dlx.terminal"} {
		m.QueueOldestAge.WithLabelValues(q)
	}
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
