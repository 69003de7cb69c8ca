package listener

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/outbox"
)

// Monitor samples queue depths (passive declares: no management plugin),
// the age of the oldest message in the main and terminal queues, dead
// letters and the outbox, into metrics. It never reads a queue: on a quorum
// queue every basic.get that puts the message back counts as a failed
// delivery toward its limit.
//
// The main queue's age, when it holds messages, is the age of the message
// the consumer received last (its AMQP timestamp, else when it arrived):
// the messages still waiting came after it, so the oldest of them has
// waited about that long; when the consumer is paused it keeps growing.
// The terminal queue's is the oldest NEW dead letter's first failure.
type Monitor struct {
	URL      string
	Name     string
	TLS      *tls.Config
	Delays   []time.Duration
	Store    *deadletter.Store
	DB       *sqlx.DB
	Metrics  *metrics.Metrics
	Interval time.Duration
	Log      *zap.Logger
	// Consumer tells when the newest delivered message entered the main
	// queue, and each wait queue; nil: their ages are not reported.
	Consumer interface {
		LastEnqueued() time.Time
		WaitEntered(queue string) time.Time
	}
	// Redis tells which Redis server (the master, behind Sentinel) paysvc
	// reaches; nil: not followed.
	Redis interface {
		Server(ctx context.Context) (string, error)
	}
	// Parker tells how many terminal messages this process's parker holds
	// and has not parked yet (unacked: no queue depth counts them); nil:
	// none.
	Parker interface{ Holding() int }
	// Retries is the retry ledger: paysvc_retry_copies_overdue counts the
	// copies overdue in it; nil: not reported.
	Retries interface {
		Overdue(ctx context.Context, now time.Time) (int64, error)
		Prune(ctx context.Context, before time.Time) error
	}

	conn    *amqp.Connection
	redis   atomic.Pointer[string]
	lastNew int // NEW dead letters at the last sample the database answered
}

// RedisServer returns the Redis server (master) seen at the last sample, or "".
func (m *Monitor) RedisServer() string {
	if s := m.redis.Load(); s != nil {
		return *s
	}
	return ""
}

// followRedis records the Redis server paysvc reaches and counts a change
// of master as a failover.
func (m *Monitor) followRedis(ctx context.Context) {
	if m.Redis == nil {
		return
	}
	addr, err := m.Redis.Server(ctx)
	if err != nil {
		return // unreachable, or CLIENT INFO refused by an ACL: nothing to say
	}
	if prev := m.redis.Swap(&addr); prev != nil && *prev != addr {
		m.Metrics.Failovers.WithLabelValues("redis").Inc()
		m.Log.Warn("redis master changed", zap.String("from", *prev), zap.String("redis_server", addr))
	}
}

// Run samples every Interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	defer m.close()
	for {
		if err := m.Poll(ctx); err != nil && ctx.Err() == nil {
			m.Log.Warn("monitor: sampling failed", zap.Error(err))
			if errors.As(err, new(brokerError)) {
				// Only the broker's failures cost the connection: a
				// database outage is not a lost broker session.
				m.Metrics.Reconnects.WithLabelValues("monitor").Inc()
				m.close()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(m.Interval):
		}
	}
}

func (m *Monitor) close() {
	if m.conn != nil {
		broker.CloseConn(m.conn) // bounded: a blocked broker may never answer
		m.conn = nil
	}
}

// brokerError is a sample that failed at the broker.
type brokerError struct{ error }

func (e brokerError) Unwrap() error { return e.error }

// Poll takes one sample: the database's figures and the broker's, each
// whatever the other's outage (the queues matter most while the database
// is down).
func (m *Monitor) Poll(ctx context.Context) error {
	now := time.Now()
	m.followRedis(ctx)
	m.pollRetries(ctx, now)
	// Bounded: a black-holed database must not stall the broker's sample.
	dbCtx, cancel := context.WithTimeout(ctx, max(m.Interval, 5*time.Second))
	newCount, oldestNew, dbErr := m.pollDB(dbCtx)
	cancel()
	if dbErr == nil {
		m.lastNew = newCount
	}
	depths, err := m.pollBroker(ctx, now)
	if err != nil {
		return errors.Join(dbErr, brokerError{err})
	}
	held := 0
	if m.Parker != nil {
		held = m.Parker.Holding()
	}
	if dbErr != nil {
		// The queues are measured; the dead letters are as last seen.
		// Messages parked nowhere while the database is down stay in the
		// terminal and overflow queues or in the parker's hands, and must
		// count.
		m.Metrics.TerminalPending.Set(float64(depths[TerminalQueue] + depths[OverflowQueue] + held + m.lastNew))
		return dbErr
	}
	var terminalAge time.Duration
	if !oldestNew.IsZero() {
		terminalAge = max(now.Sub(oldestNew), 0)
	}
	m.Metrics.QueueOldestAge.WithLabelValues(TerminalQueue).Set(terminalAge.Seconds())
	m.Metrics.TerminalPending.Set(float64(depths[TerminalQueue] + depths[OverflowQueue] + held + newCount))
	return nil
}

// retryForget is how long an overdue copy stays in the retry ledger: past
// it, it was dealt with by hand, or its removal was lost.
const retryForget = 7 * 24 * time.Hour

// pollRetries samples the retry copies overdue (a copy published to a wait
// queue and not back by its delay and a margin: the broker stranded it, or
// nothing brought it back), and forgets those overdue for retryForget.
// Redis trouble leaves the gauge as last sampled.
func (m *Monitor) pollRetries(ctx context.Context, now time.Time) {
	if m.Retries == nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := m.Retries.Prune(rctx, now.Add(-retryForget)); err != nil {
		m.Log.Debug("retry ledger: prune failed", zap.Error(err))
	}
	n, err := m.Retries.Overdue(rctx, now)
	if err != nil {
		m.Log.Warn("retry ledger: could not count the overdue copies", zap.Error(err))
		return
	}
	if n > 0 {
		m.Log.Warn("retry copies overdue: published to a wait queue and not back (docs/operations.md, \"Retry copies overdue\")",
			zap.Int64("copies", n))
	}
	m.Metrics.RetryCopiesOverdue.Set(float64(n))
}

// pollDB samples the dead letters and the outbox.
func (m *Monitor) pollDB(ctx context.Context) (newCount int, oldestNew time.Time, err error) {
	newCount, oldestNew, err = m.Store.Stats(ctx)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("dead letter stats: %w", err)
	}
	m.Metrics.DeadLettersNew.Set(float64(newCount))
	byClass, err := m.Store.NewByClass(ctx)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("dead letter stats: %w", err)
	}
	m.Metrics.DeadLettersClass.Reset() // a class whose rows were all dealt with goes
	for class, n := range byClass {
		m.Metrics.DeadLettersClass.WithLabelValues(class).Set(float64(n))
	}
	backlog, err := outbox.Stats(ctx, m.DB)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("outbox stats: %w", err)
	}
	m.Metrics.OutboxPending.Set(float64(backlog.Pending))
	m.Metrics.OutboxOldestAge.Set(backlog.OldestAge.Seconds())
	return newCount, oldestNew, nil
}

// pollBroker samples the queues' depths and ages.
func (m *Monitor) pollBroker(ctx context.Context, now time.Time) (map[string]int, error) {
	if m.conn == nil || m.conn.IsClosed() {
		conn, err := broker.Dial(m.URL, m.Name+" monitor", m.TLS)
		if err != nil {
			return nil, err
		}
		m.conn = conn
	}
	// A broker that stops answering must not hold a shutdown: the end of
	// ctx closes the connection under a blocked call (the next Poll, if
	// any, dials again).
	conn := m.conn
	defer context.AfterFunc(ctx, func() { broker.CloseConn(conn) })()
	queues := []string{MainQueue, TerminalQueue, OverflowQueue}
	for _, d := range m.Delays {
		queues = append(queues, WaitQueue(d))
	}
	depths := map[string]int{}
	for _, q := range queues {
		depth, err := m.depth(q)
		if err != nil {
			return nil, err
		}
		depths[q] = depth
		m.Metrics.QueueMessages.WithLabelValues(q).Set(float64(depth))
	}
	var mainAge time.Duration
	if depths[MainQueue] > 0 && m.Consumer != nil {
		if t := m.Consumer.LastEnqueued(); !t.IsZero() {
			mainAge = max(now.Sub(t), 0)
		}
	}
	m.Metrics.QueueOldestAge.WithLabelValues(MainQueue).Set(mainAge.Seconds())
	for _, d := range m.Delays {
		q := WaitQueue(d)
		var age time.Duration
		if depths[q] > 0 && m.Consumer != nil {
			if t := m.Consumer.WaitEntered(q); !t.IsZero() {
				age = max(now.Sub(t), 0)
			}
		}
		m.Metrics.QueueOldestAge.WithLabelValues(q).Set(age.Seconds())
	}
	return depths, nil
}

// depth is a queue's ready messages, from a passive declare.
func (m *Monitor) depth(q string) (int, error) {
	ch, err := m.conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("inspect %s: %w", q, err)
	}
	return st.Messages, nil
}
