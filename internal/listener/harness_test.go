package listener_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// env is one test's isolated world: its own database, vhost and key prefix.
type env struct {
	t         *testing.T
	dsn       string
	db        *sqlx.DB
	amqpURL   string
	redisAddr string
	rdb       *redis.Client
	prefix    string
	conn      *amqp.Connection
	ch        *amqp.Channel
	delays    []time.Duration
	logs      *observer.ObservedLogs
	log       *zap.Logger
	metrics   *metrics.Metrics
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, delays: []time.Duration{200 * time.Millisecond, 300 * time.Millisecond}, metrics: metrics.New()}
	e.dsn, e.db = testenv.MySQL(t)
	e.amqpURL = testenv.AMQP(t)
	e.rdb, e.prefix = testenv.Redis(t)
	e.redisAddr = testenv.RedisAddr()
	core, logs := observer.New(zapcore.DebugLevel)
	e.logs = logs
	t.Cleanup(func() {
		if t.Failed() {
			for _, entry := range logs.All() {
				t.Logf("%s %s %s %v", entry.Time.Format("15:04:05.000"), entry.Level, entry.Message, entry.ContextMap())
			}
		}
	})
	e.log = zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel)).Core()))
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatalf("rabbitmq unreachable (start it: scripts/ensure-services.sh): %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn = conn
	e.ch = e.channel()
	return e
}

func (e *env) channel() *amqp.Channel {
	ch, err := e.conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	return ch
}

func (e *env) declare() {
	e.t.Helper()
	ch := e.channel()
	defer ch.Close()
	if err := listener.Declare(ch, e.delays); err != nil {
		e.t.Fatal(err)
	}
}

// consumer is a running listener.Consumer.
type consumer struct {
	*listener.Consumer
	stop func() error
	done chan error
}

// wait returns Run's result when Run returns by itself.
func (c *consumer) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

// setup is what a test may change before its consumer starts: the
// consumer's config, and how its payments are grouped (order.Grouper).
type setup struct {
	listener.Config
	GroupSize  int // payments per transaction at most; 1: each alone
	GroupConns int // grouped transactions running at once
}

type option func(*setup)

// start runs a consumer against the env; it is stopped at cleanup.
func (e *env) start(redisAddr, dsn string, opts ...option) *consumer {
	e.t.Helper()
	cfg := setup{
		Config: listener.Config{
			URL:            e.amqpURL,
			ConnectionName: e.t.Name(),
			Prefetch:       8,
			Workers:        4,
			Retry:          listener.RetryPolicy{Delays: e.delays, MaxAttempts: 3},
			RedisFallback:  listener.FallbackClosed,
			HandleTimeout:  10 * time.Second,
			DrainTimeout:   10 * time.Second,
			PublishTimeout: 5 * time.Second,
			MaxBackoff:     500 * time.Millisecond,
			Metrics:        e.metrics,
			// As paysvc runs by default: RabbitMQ 3.10 takes the
			// argument and ignores it.
			ConsumerTimeout: 24 * time.Hour,
		},
		GroupSize:  16, // as paysvc runs by default
		GroupConns: 2,
	}
	for _, o := range opts {
		o(&cfg)
	}
	db := e.db
	if dsn != e.dsn {
		var err error
		if db, err = sqldb.Open(context.Background(), dsn, 8); err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { db.Close() })
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: 1})
	e.t.Cleanup(func() { rdb.Close() })
	guard := idem.New(rdb, idem.Config{KeyPrefix: e.prefix, TTL: time.Hour, Lease: 5 * time.Second})
	e.t.Cleanup(guard.StartPipeline(2, 64)) // as the daemon does; runs after the consumer's stop
	orders := order.NewStore(db)
	grouper := orders.StartGrouper(cfg.GroupConns, cfg.GroupSize, func(n int) { e.metrics.GroupSize.Observe(float64(n)) })
	e.t.Cleanup(grouper.Stop) // as the daemon does; runs after the consumer's stop
	c := listener.New(cfg.Config, orders, grouper, guard, e.log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
				done <- runErr
			case <-time.After(30 * time.Second):
				runErr = fmt.Errorf("consumer did not stop within 30s")
			}
		})
		return runErr
	}
	e.t.Cleanup(func() { stop() })
	return &consumer{Consumer: c, stop: stop, done: done}
}

func (e *env) seedAccount(userID int64, balance string) {
	e.db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (?, ?)", userID, balance)
}

func (e *env) seedOrder(orderNo string, userID int64, amount string) {
	e.db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, ?)", orderNo, userID, amount)
}

func body(orderNo string, userID int64, amount string) []byte {
	b, _ := json.Marshal(map[string]any{"orderNo": orderNo, "userId": userID, "amount": json.Number(amount)})
	return b
}

// seedOrders seeds n orders of 1.00 for user, numbered with format (one
// %d), and returns a payment message for each, in order.
func (e *env) seedOrders(format string, user int64, n int) [][]byte {
	bodies := make([][]byte, 0, n)
	for i := range n {
		no := fmt.Sprintf(format, i)
		e.seedOrder(no, user, "1.00")
		bodies = append(bodies, body(no, user, "1.00"))
	}
	return bodies
}

func (e *env) publish(bodies ...[]byte) {
	e.t.Helper()
	testenv.Publish(e.t, e.amqpURL, listener.MainQueue, bodies...)
}

func (e *env) depth(queue string) int {
	e.t.Helper()
	return testenv.Depth(e.t, e.amqpURL, queue)
}

func (e *env) getAll(queue string) []amqp.Delivery {
	e.t.Helper()
	return testenv.GetAll(e.t, e.amqpURL, queue)
}

// results counts logged outcomes by result (FIRST, DUPLICATE, RETRY,
// TERMINAL, REQUEUE).
func (e *env) results() map[string]int {
	n := map[string]int{}
	for _, entry := range e.logs.FilterMessage("message handled").All() {
		n[entry.ContextMap()["result"].(string)]++
	}
	return n
}

func (e *env) waitResults(within time.Duration, cond func(map[string]int) bool, what string) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for !cond(e.results()) {
		if time.Now().After(deadline) {
			e.t.Fatalf("after %s: %s; outcomes %v", within, what, e.results())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) status(orderNo string) order.Status {
	var s order.Status
	if err := e.db.Get(&s, "SELECT status FROM t_order WHERE order_no = ?", orderNo); err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *env) balance(userID int64) money.Cents {
	var b money.Cents
	if err := e.db.Get(&b, "SELECT balance FROM t_account WHERE user_id = ?", userID); err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) flows(orderNo string) int {
	var n int
	if err := e.db.Get(&n, "SELECT COUNT(*) FROM t_account_flow WHERE biz_no = ?", orderNo); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) totalFlows() int {
	var n int
	if err := e.db.Get(&n, "SELECT COUNT(*) FROM t_account_flow"); err != nil {
		e.t.Fatal(err)
	}
	return n
}
