package listener

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/metrics"
)

// Monitor samples queue depths (passive declares: no management plugin), the
// age of the oldest message in the main and terminal queues, dead letters
// and the outbox, into metrics.
//
// The oldest age comes from peeking at the head message (basic.get, then
// nack with requeue, which puts it back in place): its timestamp property,
// else its x-last-failed-at header, else how long the same message has been
// seen at the head. Quorum wait queues are not peeked: their TTL bounds
// their age.
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

	conn *amqp.Connection
	head map[string]seenHead
}

type seenHead struct {
	key   string
	since time.Time
}

// Run samples every Interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	defer m.close()
	for {
		if err := m.Poll(ctx); err != nil && ctx.Err() == nil {
			m.Log.Warn("monitor: sampling failed", zap.Error(err))
			m.Metrics.Reconnects.WithLabelValues("monitor").Inc()
			m.close()
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
		m.conn.Close()
		m.conn = nil
	}
}

// Poll takes one sample.
func (m *Monitor) Poll(ctx context.Context) error {
	if m.head == nil {
		m.head = map[string]seenHead{}
	}
	now := time.Now()
	newCount, oldestNew, err := m.Store.Stats(ctx)
	if err != nil {
		return fmt.Errorf("dead letter stats: %w", err)
	}
	m.Metrics.DeadLettersNew.Set(float64(newCount))
	var outbox int
	if err := m.DB.GetContext(ctx, &outbox, "SELECT COUNT(*) FROM t_outbox WHERE status = 'PENDING'"); err != nil {
		return fmt.Errorf("outbox stats: %w", err)
	}
	m.Metrics.OutboxPending.Set(float64(outbox))

	if m.conn == nil || m.conn.IsClosed() {
		conn, err := broker.Dial(m.URL, m.Name+" monitor", m.TLS)
		if err != nil {
			return err
		}
		m.conn = conn
	}
	queues := []string{MainQueue, TerminalQueue}
	for _, d := range m.Delays {
		queues = append(queues, WaitQueue(d))
	}
	for _, q := range queues {
		depth, age, err := m.sample(q, q == MainQueue || q == TerminalQueue, now)
		if err != nil {
			return err
		}
		m.Metrics.QueueMessages.WithLabelValues(q).Set(float64(depth))
		if q == TerminalQueue {
			if !oldestNew.IsZero() {
				age = max(age, now.Sub(oldestNew))
			}
			m.Metrics.TerminalPending.Set(float64(depth + newCount))
		}
		if q == MainQueue || q == TerminalQueue {
			m.Metrics.QueueOldestAge.WithLabelValues(q).Set(age.Seconds())
		}
	}
	return nil
}

// sample returns a queue's depth and, if peek, the age of its head message.
func (m *Monitor) sample(q string, peek bool, now time.Time) (int, time.Duration, error) {
	ch, err := m.conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("inspect %s: %w", q, err)
	}
	if !peek || st.Messages == 0 {
		delete(m.head, q)
		return st.Messages, 0, nil
	}
	d, ok, err := ch.Get(q, false)
	if err != nil || !ok {
		return st.Messages, 0, err
	}
	defer d.Nack(false, true) // back in place, untouched
	if !d.Timestamp.IsZero() {
		return st.Messages, max(now.Sub(d.Timestamp), 0), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, headerString(d.Headers, HeaderLastFailedAt)); err == nil {
		return st.Messages, max(now.Sub(t), 0), nil
	}
	key := d.MessageId
	if key == "" {
		sum := sha256.Sum256(d.Body)
		key = hex.EncodeToString(sum[:])
	}
	h, seen := m.head[q]
	if !seen || h.key != key {
		h = seenHead{key: key, since: now}
		m.head[q] = h
	}
	return st.Messages, now.Sub(h.since), nil
}
