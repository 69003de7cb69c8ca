package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/paysvc/paysvc/internal/listener"
)

// reference is the reference consumer, the one a team writes first, which
// paysvc is measured against on the same servers, messages and seed: one
// connection and one channel, a prefetch window, N goroutines; per
// message a Redis SET NX EX on the order number (present: ack, done), then
// one MySQL transaction with one statement per round trip
// (interpolateParams=true): the INIT→PAID update, the flow, the
// conditional balance update, COMMIT; then ack. On an error the key is
// deleted and the message nacked with requeue. No retries, no notices, no
// trace, no metrics. It is not paysvc's code and shares none.
type reference struct {
	workers, prefetch int
	db                *sql.DB
	rdb               *redis.Client
	prefix            string
}

// referenceMessage is the payment as the reference decodes it: plainly.
type referenceMessage struct {
	OrderNo string      `json:"orderNo"`
	UserID  int64       `json:"userId"`
	Amount  json.Number `json:"amount"`
}

// openReference opens what both reference consumers use: a MySQL pool
// and a Redis client of workers connections each, and a channel
// consuming the main queue (as "reference") with prefetch; closeAll
// closes them.
func openReference(b *bed, o *options, workers, prefetch int) (_ *reference, _ *amqp.Channel, _ <-chan amqp.Delivery, closeAll func(), err error) {
	var closers []func() error
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	cfg, err := mysql.ParseDSN(b.DSN)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cfg.InterpolateParams = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, nil, nil, nil, err
	}
	closers = append(closers, db.Close)
	db.SetMaxOpenConns(workers)
	db.SetMaxIdleConns(workers)
	rdb := redis.NewClient(&redis.Options{Addr: o.redisAddr, PoolSize: workers})
	closers = append(closers, rdb.Close)
	r := &reference{workers: workers, prefetch: prefetch, db: db, rdb: rdb, prefix: b.prefix + "ref:"}
	conn, err := amqp.Dial(b.amqpURL)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	closers = append(closers, conn.Close)
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return nil, nil, nil, nil, err
	}
	deliveries, err := ch.Consume(listener.MainQueue, "reference", false, false, false, false, nil)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return r, ch, deliveries, closeAll, nil
}

// runReference drains n messages from the bed's main queue with the
// reference consumer; it returns when n have been acked (or ctx ends).
func runReference(ctx context.Context, b *bed, o *options, workers, prefetch, n int) error {
	r, ch, deliveries, closeAll, err := openReference(b, o, workers, prefetch)
	if err != nil {
		return err
	}
	defer closeAll()
	var mu sync.Mutex
	acked := 0
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for d := range deliveries {
				if r.handle(ctx, d) {
					mu.Lock()
					acked++
					if acked == n {
						close(done)
					}
					mu.Unlock()
				}
			}
		})
	}
	// The deliveries end early when the broker closes the channel or the
	// connection: an error, not a wait for the deadline.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-done:
	case <-ctx.Done():
	case <-finished:
		mu.Lock()
		defer mu.Unlock()
		if acked < n {
			return fmt.Errorf("the broker ended the deliveries after %d of %d messages were acked", acked, n)
		}
	}
	ch.Cancel("reference", false)
	wg.Wait()
	return ctx.Err()
}

// handle settles one delivery and reports whether it was acked.
func (r *reference) handle(ctx context.Context, d amqp.Delivery) bool {
	var m referenceMessage
	if err := json.Unmarshal(d.Body, &m); err != nil {
		d.Reject(false)
		return false
	}
	key := r.prefix + m.OrderNo
	fresh, err := r.rdb.SetNX(ctx, key, "1", 24*time.Hour).Result()
	if err != nil {
		d.Nack(false, true)
		return false
	}
	if !fresh {
		return d.Ack(false) == nil
	}
	if err := r.pay(ctx, m); err != nil {
		r.rdb.Del(ctx, key)
		d.Nack(false, true)
		return false
	}
	return d.Ack(false) == nil
}

func (r *reference) pay(ctx context.Context, m referenceMessage) error {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := r.payIn(ctx, tx, m); err != nil {
		return err
	}
	return tx.Commit()
}

// payIn is the payment's three statements in tx.
func (r *reference) payIn(ctx context.Context, tx *sql.Tx, m referenceMessage) error {
	if _, err := tx.ExecContext(ctx, "UPDATE t_order SET status='PAID', pay_time=NOW(3) WHERE order_no=? AND status='INIT'",
		m.OrderNo); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO t_account_flow (user_id, amount, biz_no, type, remark) VALUES (?, -?, ?, 'PAY_DEDUCT', '')",
		m.UserID, string(m.Amount), m.OrderNo); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE t_account SET balance=balance-? WHERE user_id=? AND balance>=?",
		string(m.Amount), m.UserID, string(m.Amount)); err != nil {
		return err
	}
	return nil
}

// runReferenceBatched drains n messages with the reference's batched
// variant: the same consumer, but one reader takes what is waiting, up to
// batch deliveries (never waiting for more), and a goroutine of N claims them in one Redis
// pipeline (SET NX EX each), applies the fresh ones in one transaction
// (the same three statements per payment, one round trip each, in (user,
// order) order so that two batches never wait on each other in a cycle),
// commits once and acks each. On an error its keys are deleted and its
// messages nacked with requeue; no retries, notices, trace or metrics.
func runReferenceBatched(ctx context.Context, b *bed, o *options, workers, prefetch, batch, n int) error {
	r, ch, deliveries, closeAll, err := openReference(b, o, workers, prefetch)
	if err != nil {
		return err
	}
	defer closeAll()
	// One reader forms the batches: it gathers deliveries, up to batch,
	// while every goroutine is busy, and hands what it has to the first
	// free one (never waiting for more). Goroutines each taking from the
	// deliveries themselves, or a reader that forms a batch before a
	// goroutine is free, make batches of about one.
	batches := make(chan []amqp.Delivery)
	go func() {
		defer close(batches)
		var ds []amqp.Delivery
		for {
			if len(ds) == 0 {
				d, ok := <-deliveries
				if !ok {
					return
				}
				ds = append(ds, d)
			}
			if len(ds) == batch {
				batches <- ds
				ds = nil
				continue
			}
			select {
			case batches <- ds:
				ds = nil
			case d, ok := <-deliveries:
				if !ok {
					batches <- ds
					return
				}
				ds = append(ds, d)
			}
		}
	}()
	var mu sync.Mutex
	acked := 0
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ds := range batches {
				if k := r.handleBatch(ctx, ds); k > 0 {
					mu.Lock()
					if acked < n && acked+k >= n {
						close(done)
					}
					acked += k
					mu.Unlock()
				}
			}
		})
	}
	// The deliveries end early when the broker closes the channel or the
	// connection: an error, not a wait for the deadline.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-done:
	case <-ctx.Done():
	case <-finished:
		mu.Lock()
		defer mu.Unlock()
		if acked < n {
			return fmt.Errorf("the broker ended the deliveries after %d of %d messages were acked", acked, n)
		}
	}
	ch.Cancel("reference", false)
	wg.Wait()
	return ctx.Err()
}

// handleBatch settles ds and returns how many it acked.
func (r *reference) handleBatch(ctx context.Context, ds []amqp.Delivery) int {
	type msg struct {
		d   amqp.Delivery
		m   referenceMessage
		key string
		set *redis.BoolCmd
	}
	var ms []*msg
	acked := 0
	for _, d := range ds {
		var m referenceMessage
		if err := json.Unmarshal(d.Body, &m); err != nil {
			d.Reject(false)
			continue
		}
		ms = append(ms, &msg{d: d, m: m, key: r.prefix + m.OrderNo})
	}
	pipe := r.rdb.Pipeline()
	for _, m := range ms {
		m.set = pipe.SetNX(ctx, m.key, "1", 24*time.Hour)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		for _, m := range ms {
			m.d.Nack(false, true)
		}
		return 0
	}
	var fresh []*msg
	for _, m := range ms {
		if m.set.Val() {
			fresh = append(fresh, m)
		} else if m.d.Ack(false) == nil {
			acked++
		}
	}
	if len(fresh) == 0 {
		return acked
	}
	slices.SortFunc(fresh, func(a, b *msg) int {
		return cmp.Or(cmp.Compare(a.m.UserID, b.m.UserID), strings.Compare(a.m.OrderNo, b.m.OrderNo))
	})
	err := func() error {
		tx, err := r.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		for _, m := range fresh {
			if err := r.payIn(ctx, tx, m.m); err != nil {
				return err
			}
		}
		return tx.Commit()
	}()
	if err != nil {
		keys := make([]string, len(fresh))
		for i, m := range fresh {
			keys[i] = m.key
		}
		r.rdb.Del(ctx, keys...)
		for _, m := range fresh {
			m.d.Nack(false, true)
		}
		return acked
	}
	for _, m := range fresh {
		if m.d.Ack(false) == nil {
			acked++
		}
	}
	return acked
}
