package main

import (
	"cmp"
	"context"
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

// daemon wires config → MySQL → Redis → consumer, parker, outbox dispatcher,
// alerter, monitor, scheduled reconciliation and pruning → admin HTTP, and runs until ctx
// ends. The consumer decides the exit: its drain comes first.
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
	// Spans (trace.otlpEndpoint or the OTEL_* variables), set up before
	// any dependency: a sampler paysvc does not know stops it at once. What
	// is queued is exported last, after the consumer's last span, within
	// what is left of the drain bound counted from the stop.
	spans, err := tracing.Start(ctx, tracing.Options{Endpoint: cfg.Trace.OTLPEndpoint, SampleRatio: cfg.Trace.SampleRatio,
		Version: version, Log: log, Dropped: func(reason string, n int) { m.SpansDropped.WithLabelValues(reason).Add(float64(n)) }})
	if err != nil {
		return err
	}
	if spans != nil {
		var stoppedAt atomic.Int64
		stopWatch := context.AfterFunc(ctx, func() { stoppedAt.Store(time.Now().UnixNano()) })
		defer func() {
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
		}()
	}
	health.stage("waiting for MySQL")
	db, err := openMySQL(ctx, cfg, log)
	if err != nil && ctx.Err() != nil {
		return nil // stopped while waiting
	}
	if err != nil {
		return err
	}
	defer db.Close()

	ropts, err := cfg.redisOptions(cfg.AMQP.Workers + redisSpareConns)
	if err != nil {
		return err
	}
	amqpTLS, err := cfg.amqpTLS()
	if err != nil {
		return err
	}
	rdb := redis.NewUniversalClient(ropts)
	defer rdb.Close()
	guard := idem.New(rdb, idem.Config{
		KeyPrefix: cfg.Idempotent.KeyPrefix,
		TTL:       cfg.Idempotent.TTL,
		Lease:     cfg.Idempotent.Lease,
	})

	host, _ := os.Hostname()
	name := fmt.Sprintf("paysvc %s %s/%d", version, host, os.Getpid())
	orders := order.NewStore(db)
	orders.OnRetry = func(error) { m.TxRetries.Inc() }
	// A row another transaction holds locked: its payments wait alone, one
	// per account at a time, and no group waits for it (order.Grouper).
	orders.OnHeld = m.HeldLocked.Inc
	orders.OnLocked = func(userID int64, orderNo string) {
		if orderNo != "" {
			log.Warn("order row found locked by another transaction: its payment runs alone", zap.String("order_no", orderNo))
			return
		}
		log.Warn("account row found locked by another transaction: its payments wait alone, one at a time",
			zap.Int64("user_id", userID))
	}
	// The notices of the payments this process commits are born leased to
	// it and handed straight to its dispatcher: no poll, no lease update.
	dispatcher := &outbox.Dispatcher{DB: db, URL: cfg.AMQP.URL, TLS: amqpTLS, Name: name, Log: log,
		Interval: dispatchInterval, Batch: dispatchBatch, Handoff: make(chan []string, dispatchHandoff),
		Blocked: m.BrokerBlocked.WithLabelValues("outbox")}
	orders.NoticeLease, orders.OnCommitted = outbox.LeaseTime, dispatcher.Offer
	deadLetters := deadletter.NewStore(db)
	events := &timeline.Recorder{DB: db, Instance: fmt.Sprintf("%s/%d", host, os.Getpid())}

	// Three batchers hand what waits at one moment to one round trip
	// (internal/batch), each started here and stopped after the consumer
	// has drained: payments that arrive together share a transaction
	// (mysql.groupSize, mysql.groupConns; with groupSize 1 each is paid
	// alone), claims and done marks share a Redis pipeline, and outcomes
	// recorded together share an INSERT.
	grouper := orders.StartGrouper(cfg.MySQL.GroupConns, cfg.MySQL.GroupSize, func(n int) { m.GroupSize.Observe(float64(n)) })
	defer grouper.Stop()
	stopPipeline := guard.StartPipeline(pipelineRunners, pipelineMax)
	defer stopPipeline()
	stopEvents := events.Start(eventRunners, eventMax)
	defer stopEvents()
	consumer := listener.New(listener.Config{
		URL:             cfg.AMQP.URL,
		TLS:             amqpTLS,
		ConnectionName:  name,
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
		Events:          events,
		FirstLog:        logging.Sampled(log, cfg.Log.FirstPerSecond, firstThereafter),
		Spans:           spans,
	}, orders, grouper, guard, log)

	// Helpers stop when the consumer has drained, not before.
	helpers, stopHelpers := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() { stopHelpers(); wg.Wait() }()

	wake := make(chan struct{}, 1)
	parker := &listener.Parker{URL: cfg.AMQP.URL, Name: name, TLS: amqpTLS, Store: deadLetters, Log: log, Metrics: m,
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
	mover := &listener.Mover{URL: cfg.AMQP.URL, Name: name, TLS: amqpTLS, Delays: cfg.Retry.Delays, Log: log, Metrics: m,
		PublishTimeout: publishTimeout, ConsumerTimeout: cfg.AMQP.ConsumerTimeout, Ledger: guard.Retries()}
	wg.Go(func() { mover.Run(helpers) })
	if cfg.Alert.WebhookURL != "" {
		alerter := &deadletter.Alerter{Store: deadLetters, URL: cfg.Alert.WebhookURL, Log: log,
			Client: &http.Client{Timeout: alertTimeout}, Interval: alertInterval, Wake: wake,
			OnFailure: m.AlertFailures.Inc}
		wg.Go(func() { alerter.Run(helpers) })
	}
	wg.Go(func() { dispatcher.Run(helpers) })
	monitor := &listener.Monitor{URL: cfg.AMQP.URL, Name: name, TLS: amqpTLS, Delays: cfg.Retry.Delays, Store: deadLetters,
		DB: db, Metrics: m, Interval: cfg.Metrics.QueueInterval, Log: log, Consumer: consumer, Redis: guard,
		Parker: parker, Retries: guard.Retries()}
	wg.Go(func() { monitor.Run(helpers) })
	if cfg.Reconcile.Interval > 0 {
		wg.Go(func() { scheduledReconcile(helpers, cfg, db, m, log) })
	}
	if cfg.Prune.Interval > 0 {
		wg.Go(func() { scheduledPrune(helpers, cfg, m, log) })
	}
	if cfg.Reconcile.LostSweepRate > 0 {
		// Payments a database failover lost leave no row to find: their
		// done keys in Redis are walked for orders the database has INIT.
		sweeper := &reconcile.Sweeper{DB: db, Keys: guard, Rate: cfg.Reconcile.LostSweepRate, Every: cfg.Metrics.QueueInterval,
			Report: func(n int) { m.LostPayments.Set(float64(n)) }, Log: log}
		wg.Go(func() { sweeper.Run(helpers) })
	}

	if health != nil {
		pub := &broker.DialingPublisher{URL: cfg.AMQP.URL, Name: name + " admin", Timeout: publishTimeout, TLS: amqpTLS}
		defer pub.Close()
		ops, err := cfg.adminOperators() // validated at load
		if err != nil {
			return err
		}
		health.serve(consumer, monitor, &admin.Server{Store: deadLetters, Operators: ops, Log: log,
			InsecureCookie: !cfg.Admin.SecureCookie,
			Sessions:       &admin.Sessions{DB: db, TTL: cfg.Admin.SessionTTL},
			Replayer:       &replay.Replayer{Store: deadLetters, Orders: orders, DB: db, Publish: pub, Every: replay.DefaultEvery}})
	}
	err = consumer.Run(ctx)
	log.Info("paysvc stopped", zap.Error(err))
	return err
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
