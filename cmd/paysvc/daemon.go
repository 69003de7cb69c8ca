package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/admin"
	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/logging"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/reconcile"
	"github.com/paysvc/paysvc/internal/replay"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/timeline"
	"github.com/paysvc/paysvc/internal/tracing"
)

// daemon runs paysvc until ctx ends. It starts, in this order, the health
// listener, span export, the clients (MySQL, then Redis), the batchers, the
// helpers that run beside the consumer and the admin pages, then runs the
// consumer. The consumer decides the exit: its drain comes first, then
// everything stops in the reverse order of its start.
func daemon(ctx context.Context, cfg *Config, log *zap.Logger) error {
	logLimits(log)
	// The health listener comes first, before any dependency: /healthz says
	// the process works while it waits for MySQL (a liveness or startup
	// probe must not kill a pod for an outage), /readyz says whether it
	// consumes, and a busy or bad http.addr stops start-up at once.
	m := metrics.New()
	m.SetBuild(version, cmp.Or(buildRevision(), "unknown"))
	health, err := startHealth(cfg.HTTP.Addr, cfg.Admin.Addr, m, log)
	if err != nil {
		return err
	}
	if health != nil {
		defer health.shutdown()
	}
	spans, stopSpans, err := startSpans(ctx, cfg, m, log)
	if err != nil {
		return err
	}
	defer stopSpans()
	health.stage("waiting for MySQL")
	cl, err := openClients(ctx, cfg, log)
	if errors.Is(err, errStopped) {
		return nil
	}
	if err != nil {
		return err
	}
	defer cl.close()

	p := newPieces(cfg, cl, m, log)
	grouper, stopBatchers := startBatchers(cfg, cl, p, m)
	defer stopBatchers()
	consumer := newConsumer(cfg, cl, p, grouper, m, spans, log)
	monitor, stopHelpers := startHelpers(ctx, cfg, cl, p, consumer, m, log)
	defer stopHelpers()
	if health != nil {
		stopAdmin, err := serveAdmin(health, cfg, cl, p, consumer, monitor, log)
		if err != nil {
			return err
		}
		defer stopAdmin()
	}
	err = consumer.Run(ctx)
	log.Info("paysvc stopped", zap.Error(err))
	return err
}

// startSpans sets up span export (trace.otlpEndpoint or the OTEL_*
// variables), before any dependency: a sampler paysvc does not know stops
// it at once. stop exports what is queued, after the consumer's last span,
// within what is left of the drain bound counted from the end of ctx.
// Without export, spans is nil and stop does nothing.
func startSpans(ctx context.Context, cfg *Config, m *metrics.Metrics, log *zap.Logger) (spans *tracing.Tracer, stop func(), err error) {
	spans, err = tracing.Start(ctx, tracing.Options{Endpoint: cfg.Trace.OTLPEndpoint, SampleRatio: cfg.Trace.SampleRatio,
		Version: version, Log: log, Dropped: func(reason string, n int) { m.SpansDropped.WithLabelValues(reason).Add(float64(n)) }})
	if err != nil || spans == nil {
		return nil, func() {}, err
	}
	var stoppedAt atomic.Int64
	stopWatch := context.AfterFunc(ctx, func() { stoppedAt.Store(time.Now().UnixNano()) })
	return spans, func() {
		stopWatch()
		from := time.Now()
		if at := stoppedAt.Load(); at != 0 {
			from = time.Unix(0, at)
		}
		fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), from.Add(cfg.AMQP.DrainTimeout))
		defer cancel()
		if err := spans.Shutdown(fctx); err != nil {
			log.Warn("spans not all exported at stop", zap.Error(err))
		}
	}, nil
}

// errStopped: ctx ended while the daemon waited for MySQL.
var errStopped = errors.New("stopped while waiting for MySQL")

// clients are the daemon's connections to its dependencies.
type clients struct {
	db      *sqldb.DB
	rdb     redis.UniversalClient
	guard   *idem.Guard
	amqpTLS *tls.Config // nil: the system roots
}

// openClients waits for MySQL, then opens the Redis client and its guard.
func openClients(ctx context.Context, cfg *Config, log *zap.Logger) (*clients, error) {
	db, err := openMySQL(ctx, cfg, log)
	if err != nil && ctx.Err() != nil {
		return nil, errStopped
	}
	if err != nil {
		return nil, err
	}
	ropts, err := cfg.redisOptions(cfg.AMQP.Workers + redisSpareConns)
	if err != nil {
		db.Close()
		return nil, err
	}
	amqpTLS, err := cfg.amqpTLS()
	if err != nil {
		db.Close()
		return nil, err
	}
	rdb := redis.NewUniversalClient(ropts)
	guard := idem.New(rdb, idem.Config{
		KeyPrefix: cfg.Idempotent.KeyPrefix,
		TTL:       cfg.Idempotent.TTL,
		Lease:     cfg.Idempotent.Lease,
	})
	return &clients{db: db, rdb: rdb, guard: guard, amqpTLS: amqpTLS}, nil
}

// close closes Redis, then MySQL.
func (cl *clients) close() {
	cl.rdb.Close()
	cl.db.Close()
}

// pieces are what the consumer, its helpers and the admin pages share.
type pieces struct {
	name        string // the AMQP connection name
	orders      *order.Store
	dispatcher  *outbox.Dispatcher
	deadLetters *deadletter.Store
	events      *timeline.Recorder
}

// newPieces builds the payment store, the outbox dispatcher it hands its
// notices to, the dead-letter store and the outcome recorder.
func newPieces(cfg *Config, cl *clients, m *metrics.Metrics, log *zap.Logger) *pieces {
	host, _ := os.Hostname()
	p := &pieces{name: fmt.Sprintf("paysvc %s %s/%d", version, host, os.Getpid())}
	p.orders = order.NewStore(cl.db)
	p.orders.OnRetry = func(error) { m.TxRetries.Inc() }
	// A row another transaction holds locked: its payments wait alone, one
	// per account at a time, and no group waits for it (order.Grouper).
	p.orders.OnHeld = m.HeldLocked.Inc
	p.orders.OnLocked = func(userID int64, orderNo string) {
		if orderNo != "" {
			log.Warn("order row found locked by another transaction: its payment runs alone", zap.String("order_no", orderNo))
			return
		}
		log.Warn("account row found locked by another transaction: its payments wait alone, one at a time",
			zap.Int64("user_id", userID))
	}
	// The notices of the payments this process commits are born leased to
	// it and handed straight to its dispatcher: no poll, no lease update.
	p.dispatcher = &outbox.Dispatcher{DB: cl.db, URL: cfg.AMQP.URL, TLS: cl.amqpTLS, Name: p.name, Log: log,
		Interval: dispatchInterval, Batch: dispatchBatch, Handoff: make(chan []string, dispatchHandoff),
		Blocked: m.BrokerBlocked.WithLabelValues("outbox")}
	p.orders.NoticeLease, p.orders.OnCommitted = outbox.LeaseTime, p.dispatcher.Offer
	p.deadLetters = deadletter.NewStore(cl.db)
	p.events = &timeline.Recorder{DB: cl.db, Instance: fmt.Sprintf("%s/%d", host, os.Getpid())}
	return p
}

// startBatchers starts the three batchers that hand what waits at one moment
// to one round trip (internal/batch); stop, called after the consumer has
// drained, stops them in the reverse order. Payments that arrive together
// share a transaction (mysql.groupSize, mysql.groupConns; with groupSize 1
// each is paid alone), claims and done marks share a Redis pipeline, and
// outcomes recorded together share an INSERT.
func startBatchers(cfg *Config, cl *clients, p *pieces, m *metrics.Metrics) (grouper *order.Grouper, stop func()) {
	grouper = p.orders.StartGrouper(cfg.MySQL.GroupConns, cfg.MySQL.GroupSize, func(n int) { m.GroupSize.Observe(float64(n)) })
	stopPipeline := cl.guard.StartPipeline(pipelineRunners, pipelineMax)
	stopEvents := p.events.Start(eventRunners, eventMax)
	return grouper, func() {
		stopEvents()
		stopPipeline()
		grouper.Stop()
	}
}

// newConsumer builds the consumer of the payment queue from the
// configuration and the pieces.
func newConsumer(cfg *Config, cl *clients, p *pieces, grouper *order.Grouper, m *metrics.Metrics,
	spans *tracing.Tracer, log *zap.Logger) *listener.Consumer {
	return listener.New(listener.Config{
		URL:             cfg.AMQP.URL,
		TLS:             cl.amqpTLS,
		ConnectionName:  p.name,
		Prefetch:        cfg.AMQP.Prefetch,
		Workers:         cfg.AMQP.Workers,
		Retry:           listener.RetryPolicy{Delays: cfg.Retry.Delays, MaxAttempts: cfg.Retry.MaxAttempts},
		MainQueueType:   cfg.AMQP.QueueType,
		DeliveryLimit:   cfg.AMQP.DeliveryLimit,
		ConsumerTimeout: cfg.AMQP.ConsumerTimeout,
		RedisFallback:   listener.Fallback(cfg.Idempotent.RedisFallback),
		HandleTimeout:   cfg.handleTimeout(),
		DrainTimeout:    cfg.AMQP.DrainTimeout,
		PublishTimeout:  publishTimeout,
		MaxBackoff:      maxBackoff,
		Metrics:         m,
		Events:          p.events,
		FirstLog:        logging.Sampled(log, cfg.Log.FirstPerSecond, firstThereafter),
		Spans:           spans,
	}, p.orders, grouper, cl.guard, log)
}

// startHelpers starts what runs beside the consumer: the parker, the mover,
// the alerter (with alert.webhookURL), the outbox dispatcher, the monitor,
// and the scheduled reconciliation, pruning and lost-payment sweep when
// their intervals are set. They run until stop, which the daemon calls once
// the consumer has drained, not before; stop waits for them to return.
func startHelpers(ctx context.Context, cfg *Config, cl *clients, p *pieces, consumer *listener.Consumer,
	m *metrics.Metrics, log *zap.Logger) (monitor *listener.Monitor, stop func()) {
	helpers, stopHelpers := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	stop = func() { stopHelpers(); wg.Wait() }

	wake := make(chan struct{}, 1)
	parker := &listener.Parker{URL: cfg.AMQP.URL, Name: p.name, TLS: cl.amqpTLS, Store: p.deadLetters, Log: log, Metrics: m,
		ConsumerTimeout: cfg.AMQP.ConsumerTimeout,
		OnParked: func(_ int64, becameNew bool) {
			if becameNew {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}}
	wg.Go(func() { parker.Run(helpers) })
	mover := &listener.Mover{URL: cfg.AMQP.URL, Name: p.name, TLS: cl.amqpTLS, Delays: cfg.Retry.Delays, Log: log, Metrics: m,
		PublishTimeout: publishTimeout, ConsumerTimeout: cfg.AMQP.ConsumerTimeout, Ledger: cl.guard.Retries()}
	wg.Go(func() { mover.Run(helpers) })
	if cfg.Alert.WebhookURL != "" {
		alerter := &deadletter.Alerter{Store: p.deadLetters, URL: cfg.Alert.WebhookURL, Log: log,
			Client: &http.Client{Timeout: alertTimeout}, Interval: alertInterval, Wake: wake,
			OnFailure: m.AlertFailures.Inc}
		wg.Go(func() { alerter.Run(helpers) })
	}
	wg.Go(func() { p.dispatcher.Run(helpers) })
	monitor = &listener.Monitor{URL: cfg.AMQP.URL, Name: p.name, TLS: cl.amqpTLS, Delays: cfg.Retry.Delays, Store: p.deadLetters,
		DB: cl.db, Metrics: m, Interval: cfg.Metrics.QueueInterval, Log: log, Consumer: consumer, Redis: cl.guard,
		Parker: parker, Retries: cl.guard.Retries()}
	wg.Go(func() { monitor.Run(helpers) })
	if cfg.Reconcile.Interval > 0 {
		wg.Go(func() { scheduledReconcile(helpers, cfg, cl.db, m, log) })
	}
	if cfg.Prune.Interval > 0 {
		wg.Go(func() { scheduledPrune(helpers, cfg, m, log) })
	}
	if cfg.Reconcile.LostSweepRate > 0 {
		// Payments a database failover lost leave no row to find: their
		// done keys in Redis are walked for orders the database has INIT.
		sweeper := &reconcile.Sweeper{DB: cl.db, Keys: cl.guard, Rate: cfg.Reconcile.LostSweepRate, Every: cfg.Metrics.QueueInterval,
			Report: func(n int) { m.LostPayments.Set(float64(n)) }, Log: log}
		wg.Go(func() { sweeper.Run(helpers) })
	}
	return monitor, stop
}

// serveAdmin wires the consumer, the monitor and the admin pages into the
// health listener; stop closes the publisher the pages replay through.
func serveAdmin(health *healthServer, cfg *Config, cl *clients, p *pieces, consumer *listener.Consumer,
	monitor *listener.Monitor, log *zap.Logger) (stop func(), err error) {
	pub := &broker.DialingPublisher{URL: cfg.AMQP.URL, Name: p.name + " admin", Timeout: publishTimeout, TLS: cl.amqpTLS}
	ops, err := cfg.adminOperators() // validated at load
	if err != nil {
		pub.Close()
		return nil, err
	}
	health.serve(consumer, monitor, &admin.Server{Store: p.deadLetters, Operators: ops, Log: log,
		InsecureCookie: !cfg.Admin.SecureCookie,
		Sessions:       &admin.Sessions{DB: cl.db, TTL: cfg.Admin.SessionTTL},
		Replayer:       &replay.Replayer{Store: p.deadLetters, Orders: p.orders, DB: cl.db, Publish: pub, Every: replay.DefaultEvery}})
	return func() { pub.Close() }, nil
}

// The daemon's fixed shapes and bounds, which no setting changes.
const (
	// firstThereafter: past log.firstPerSecond in a second, one applied
	// payment in this many is still logged.
	firstThereafter = 100
	// publishTimeout bounds one publish and its confirm: a retry or
	// terminal copy, or a replay from the admin pages.
	publishTimeout = 10 * time.Second
	// maxBackoff caps the consumer's reconnect and dependency-wait backoff.
	maxBackoff = 15 * time.Second
	// redisSpareConns: Redis connections beyond one per worker, for the
	// daemon's other Redis calls (dependency probes, the monitor).
	redisSpareConns = 4
	// pipelineRunners Redis pipelines run at once, each of up to
	// pipelineMax claims and done marks.
	pipelineRunners, pipelineMax = 2, 64
	// eventRunners INSERTs of trace events run at once, each of up to
	// eventMax outcomes.
	eventRunners, eventMax = 2, 64
	// The outbox dispatcher polls for due notices every dispatchInterval
	// when idle, dispatchBatch per transaction; the notices this process
	// commits reach it through a handoff holding dispatchHandoff offers
	// (an offer it cannot take is left to the poll).
	dispatchInterval = 500 * time.Millisecond
	dispatchBatch    = 100
	dispatchHandoff  = 256
	// alertTimeout bounds one dead-letter webhook call; alertInterval is
	// how often new dead letters are looked for when none wakes the
	// alerter.
	alertTimeout  = 10 * time.Second
	alertInterval = 30 * time.Second
)

// scheduledReconcile runs reconciliation over the last window, every
// interval, logging what it finds.
func scheduledReconcile(ctx context.Context, cfg *Config, db *sqldb.DB, m *metrics.Metrics, log *zap.Logger) {
	for {
		now := time.Now()
		rep, err := reconcile.Run(ctx, db, reconcile.Options{From: now.Add(-cfg.Reconcile.Window), Fix: cfg.Reconcile.Fix})
		if err != nil && ctx.Err() == nil {
			log.Error("reconcile failed", zap.Error(err))
		} else {
			m.ReconcileProblems.Set(float64(rep.Orders() + rep.Accounts()))
			m.ReconcileLastRun.SetToCurrentTime()
			for _, p := range rep.Problems {
				log.Warn("reconcile problem", zap.String("kind", p.Kind), zap.String("order_no", p.BizNo),
					zap.Int64("user_id", p.UserID), zap.String("detail", p.Detail), zap.Bool("fixed", p.Fixed))
			}
			log.Info("reconcile done", zap.Int("findings", len(rep.Problems)), zap.Int("orders", rep.Orders()),
				zap.Int("accounts", rep.Accounts()), zap.Int("reconciled", rep.Reconciled))
		}
		if !broker.Sleep(ctx, cfg.Reconcile.Interval) {
			return
		}
	}
}
