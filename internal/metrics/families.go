package metrics

import "github.com/prometheus/client_golang/prometheus"

// Each family's constructor makes its collectors and adds them to m.own,
// and makes every known series of its vectors at 0 from the start: an
// alert on increase() sees the first event, and a dashboard has a line
// before anything happened.

// handling: what became of each payment message, and the database work
// behind it.
func (m *Metrics) handling() {
	m.Messages = add(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paysvc_messages_total", Help: "Payment messages handled, by result."}, []string{"result"}))
	m.Errors = add(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paysvc_errors_total", Help: "Failed handlings, by error class."}, []string{"class"}))
	m.Duration = add(m, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "paysvc_handle_duration_seconds", Help: "Time from delivery to broker action.",
		// Up to the handling bound (idempotent.lease/2, 30 s by
		// default) and past it: a message held through an outage.
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}))
	m.GroupSize = add(m, prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "paysvc_pay_group_size", Help: "Payments per database transaction (mysql.groupSize caps it).",
		Buckets: []float64{1, 2, 4, 6, 8, 10, 15, 20, 30, 50, 75, 100}})) // mysql.groupSize: 100 at most
	m.TxRetries = add(m, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "paysvc_tx_retries_total",
		Help: "Payment transactions (single or grouped) run again after a deadlock or a lost connection."}))
	m.HeldLocked = add(m, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "paysvc_pay_held_locked_total",
		Help: "Payments kept out of grouped transactions because their account or order row was found locked by another transaction (each waited alone, one per account at a time, or was answered at once as a lock wait timeout)."}))
	m.Disagreements = add(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paysvc_guard_disagreements_total",
		Help: "Times Redis and the database disagreed: redis_new_db_applied (Redis said new, the database had applied it), redis_done_db_unpaid, redis_foreign_db_unpaid (a value paysvc does not write at the key, a hand-written consumer's; the database decided)."},
		[]string{"kind"}))
	m.RequeuedAlone = add(m, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "paysvc_requeued_alone_total",
		Help: "Messages sent back to the main queue alone, without an attempt (outcome unknown or timed out while every dependency answered)."}))
	for _, res := range []string{"FIRST", "DUPLICATE", "RETRY", "TERMINAL", "REQUEUE"} {
		m.Messages.WithLabelValues(res)
	}
	for _, kind := range []string{"redis_new_db_applied", "redis_done_db_unpaid", "redis_foreign_db_unpaid"} {
		m.Disagreements.WithLabelValues(kind)
	}
}

// consumption: whether the consumer consumes, and what paused or
// degraded it (a dependency down, a broker alarm, a reconnect, a
// failover).
func (m *Metrics) consumption() {
	m.Ready = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_ready", Help: "1 while the consumer is consuming."}))
	m.Degraded = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_degraded", Help: "1 while payments go on without the Redis guard (redisFallback=OPEN)."}))
	m.Paused = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_paused", Help: "1 while consumption is paused on a dependency that is down (messages held, not returned)."}))
	m.PauseReason = add(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "paysvc_pause_reason",
		Help: "1 for the reason consumption is paused (mysql_unavailable, mysql_read_only, mysql_writes_stalled: MySQL answers reads but does not commit writes, mysql_error, mysql_node_not_ready: a Galera node that is not Synced, redis_unavailable), 0 for the others."},
		[]string{"reason"}))
	m.Pauses = add(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paysvc_pauses_total", Help: "Times consumption paused because a dependency was down, by the error class that showed it."},
		[]string{"class"}))
	m.Held = add(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "paysvc_held_messages", Help: "Messages workers hold while consumption is paused, by the dependency that is down (0: not paused on it); broker: messages whose retry or terminal copy the broker blocks (resource alarm) or refuses (nack), held until it takes it."},
		[]string{"dependency"}))
	m.Reconnects = add(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paysvc_reconnects_total", Help: "Broker sessions that ended and were started again."}, []string{"component"}))
	m.Failovers = add(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paysvc_failovers_total",
		Help: "Times paysvc found itself on another broker node (broker) or Redis master (redis) than before."}, []string{"component"}))
	m.BrokerBlocked = add(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "paysvc_broker_blocked",
		Help: "1 while the broker blocks a connection paysvc publishes on (a memory or disk alarm): consumer (retry and terminal copies; the messages that need one are held), outbox (notices)."},
		[]string{"component"}))
	for _, d := range []string{"redis", "mysql", "other", "broker"} {
		m.Held.WithLabelValues(d)
	}
	for _, c := range []string{"consumer", "monitor", "mover"} {
		m.Reconnects.WithLabelValues(c)
	}
	for _, c := range []string{"consumer", "outbox"} {
		m.BrokerBlocked.WithLabelValues(c)
	}
}

// queues: the broker's queues as the monitor samples them, and the retry
// copies the mover holds and moves.
func (m *Metrics) queues() {
	m.QueueMessages = add(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "paysvc_queue_messages", Help: "Ready messages in each queue (passive declare)."}, []string{"queue"}))
	m.QueueOldestAge = add(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "paysvc_queue_oldest_message_age_seconds", Help: "Age of the oldest message in the main, wait and terminal queues (0 when empty; at most this old: measured without reading the queue)."},
		[]string{"queue"}))
	m.RetryCopiesMoved = add(m, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "paysvc_retry_copies_moved_total",
		Help: "Retry copies the mover took from a wait queue when due and published to the main queue (confirmed)."}))
	m.RetryCopiesHeld = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_retry_copies_held",
		Help: "Retry copies the mover holds from the wait queues until they are due (unacked: queue depths do not count them)."}))
	m.RetryCopiesOverdue = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_retry_copies_overdue",
		Help: "Retry copies published to a wait queue and not back by their delay plus a margin (the delay, a minute at least): stranded by the broker's dead-letter worker, or nothing brings them back (the retry ledger in Redis; shared by the replicas)."}))
	// The ages the monitor samples (listener.MainQueue, TerminalQueue; the
	// wait queues', named by the configured delays, on its first sample).
	for _, q := range []string{"q.pay.success", "q.pay.dlx.terminal"} {
		m.QueueOldestAge.WithLabelValues(q)
	}
}

// deadLetters: terminal messages, the dead-letter table and its alerts.
func (m *Metrics) deadLetters() {
	m.TerminalPending = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_terminal_pending", Help: "Terminal messages not dealt with: in q.pay.dlx.terminal and its overflow queue, in this process's parker's hands (taken, not yet parked), and NEW dead letters."}))
	m.ParkFallbacks = add(m, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "paysvc_park_fallbacks_total",
		Help: "Terminal messages the dead-letter table refused as they came, parked with their body alone (class unparkable)."}))
	m.DeadLettersNew = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_dead_letters_new", Help: "Dead letters in status NEW."}))
	m.DeadLettersClass = add(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "paysvc_dead_letters_new_by_class", Help: "Dead letters in status NEW, by error class."}, []string{"class"}))
	m.AlertFailures = add(m, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "paysvc_alert_webhook_failures_total", Help: "Rounds of dead-letter alerts the webhook refused or did not answer."}))
}

// outbox: the payment notices not yet published.
func (m *Metrics) outbox() {
	m.OutboxPending = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_outbox_pending", Help: "Payment notices not yet published."}))
	m.OutboxOldestAge = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_outbox_oldest_pending_age_seconds",
		Help: "Age of the oldest payment notice not yet published (0: none); the same in every replica, read from the database."}))
}

// upkeep: the daemon's scheduled reconciliation, lost-payment sweep and
// prune.
func (m *Metrics) upkeep() {
	m.ReconcileProblems = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_reconcile_problems", Help: "Orders and accounts the last scheduled reconciliation found problems with (an order once, however many checks it fails)."}))
	m.ReconcileLastRun = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_reconcile_last_run_timestamp_seconds", Help: "When the last scheduled reconciliation finished (Unix time; 0: none yet)."}))
	m.LostPayments = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_lost_payments",
		Help: "Payments paysvc applied that the database does not have (their Redis guard key says done, the order is INIT or missing: a failover or restore lost the commit), found by the last walk of the keys (reconcile.lostSweepRate), or so far in the walk under way when more."}))
	m.PrunedRows = add(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paysvc_pruned_rows_total",
		Help: "Rows the daemon's scheduled prune (prune.interval) deleted, by table: t_outbox, t_payment_event, t_admin_session, t_dead_letter."}, []string{"table"}))
	m.PruneLastRun = add(m, prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "paysvc_prune_last_run_timestamp_seconds", Help: "When this instance's last scheduled prune finished without error (Unix time; 0: none yet)."}))
	for _, table := range []string{"t_outbox", "t_payment_event", "t_admin_session", "t_dead_letter"} {
		m.PrunedRows.WithLabelValues(table)
	}
}

// process: the build and the trace export.
func (m *Metrics) process() {
	m.BuildInfo = add(m, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "paysvc_build_info",
		Help: "1, labelled with the release (the VERSION file), the VCS revision and the Go version the binary was built from."},
		[]string{"version", "revision", "goversion"}))
	m.SpansDropped = add(m, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "paysvc_trace_spans_dropped_total",
		Help: "Sampled spans that never reached the OTLP collector: queue_full (the export queue was full when the span ended), export_failed (the collector refused the batch or did not answer, retries included)."},
		[]string{"reason"}))
	for _, r := range []string{"queue_full", "export_failed"} {
		m.SpansDropped.WithLabelValues(r)
	}
}

// add adds one of paysvc's own collectors to m.own, which New registers.
func add[C prometheus.Collector](m *Metrics, c C) C {
	m.own = append(m.own, c)
	return c
}
