package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// declare declares the notice topology through a channel of its own, which
// it returns.
func declare(t *testing.T, amqpURL string) *amqp.Channel {
	t.Helper()
	ch, err := dial(t, amqpURL).Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Declare(ch); err != nil {
		t.Fatal(err)
	}
	return ch
}

// declaredNode starts a RabbitMQ node of the test's own (for a resource
// alarm) and declares the notice topology on it.
func declaredNode(t *testing.T) (node, amqpURL string) {
	t.Helper()
	node, _, addr := testenv.RabbitNode(t, "", nil)
	amqpURL = "amqp://guest:guest@" + addr + "/"
	declare(t, amqpURL)
	return node, amqpURL
}

func dial(t *testing.T, amqpURL string) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// While a batch waits on a broker that does not answer, the dispatcher
// holds no transaction and no row lock: payments go on writing notices,
// another dispatcher skips the leased rows, and the batch is scheduled
// again when its publish fails; a healthy broker then gets every notice
// once, marked SENT.
func TestDispatcherHoldsNoLockWhilePublishing(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t)
	declare(t, amqpURL)
	seedPayable(db, "N", 4)
	pay(t, order.NewStore(db), "N", 0, 1, 2)
	u, _ := url.Parse(amqpURL)
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	stuck := broker.NewPublisher(dial(t, u.String()), 3*time.Second)
	defer proxy.Down() // before the connection's cleanup, which would wait for the black hole
	proxy.BlackholeWhen(func(b []byte) bool { return bytes.Contains(b, []byte(outbox.Exchange)) })
	d := &outbox.Dispatcher{DB: db, Batch: 100, Log: zap.NewNop()}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := d.DispatchOnce(context.Background(), stuck)
		done <- result{n, err}
	}()
	testenv.Eventually(t, 5*time.Second, func() bool {
		var n int
		db.Get(&n, "SELECT COUNT(*) FROM t_outbox WHERE attempts = 1")
		return n == 3
	}, "the batch was not leased")

	// Publishing is stuck now. No transaction of this database is open...
	var open int
	err := db.Get(&open, `SELECT COUNT(*) FROM information_schema.innodb_trx t
		JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id WHERE p.db = DATABASE()`)
	if sqldb.IsSchemaOrPermission(err) { // TiDB: its own table of open transactions
		err = db.Get(&open, "SELECT COUNT(*) FROM information_schema.tidb_trx WHERE db = DATABASE()")
	}
	if err != nil {
		t.Fatal(err)
	}
	if open != 0 {
		t.Fatalf("%d transactions open while the dispatcher publishes", open)
	}
	// ... a payment writes its notice at once (leased to its process for
	// an hour, as a daemon's are: it stays out of the dispatches below),
	// the leased rows are not locked, and a second dispatcher finds
	// nothing due.
	leased := order.NewStore(db)
	leased.NoticeLease = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := leased.Pay(ctx, order.Payment{OrderNo: "N3", UserID: 4, Amount: 100}); err != nil {
		t.Fatalf("a payment while publishing: %v", err)
	}
	tx := db.MustBegin()
	tx.MustExec("SET SESSION innodb_lock_wait_timeout = 1")
	var ids []int64
	if err := tx.Select(&ids, "SELECT id FROM t_outbox WHERE biz_no IN ('N0', 'N1', 'N2') FOR UPDATE"); err != nil || len(ids) != 3 {
		t.Fatalf("the leased rows are locked: %v", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	healthy := broker.NewPublisher(dial(t, amqpURL), 3*time.Second)
	defer healthy.Close()
	if n, err := d.DispatchOnce(context.Background(), healthy); err != nil || n != 0 {
		t.Fatalf("a second dispatcher sent %d (%v): the leased rows were not hidden", n, err)
	}
	// The checks above mean something only while the stuck publish is.
	select {
	case <-done:
		t.Fatal("the stuck publish ended before the checks were done: they proved nothing")
	default:
	}

	r := <-done
	if r.err == nil || r.n != 0 {
		t.Fatalf("the stuck batch: %d sent, %v; want 0 and an error", r.n, r.err)
	}
	var pending int
	db.Get(&pending, "SELECT COUNT(*) FROM t_outbox WHERE status = 'PENDING' AND last_error <> '' AND next_attempt_at <= CURRENT_TIMESTAMP(3) + INTERVAL 2 SECOND")
	if pending != 3 {
		t.Fatalf("%d failed notices rescheduled within their backoff, want 3", pending)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		if n, err := d.DispatchOnce(context.Background(), healthy); err != nil {
			t.Logf("dispatch: %d, %v", n, err)
		}
		var sent int
		db.Get(&sent, "SELECT COUNT(*) FROM t_outbox WHERE status = 'SENT' AND sent_time >= create_time")
		return sent == 3
	}, "the notices were not sent once the broker answered")
	if n := testenv.Depth(t, amqpURL, outbox.Queue); n != 3 {
		t.Fatalf("%d notices in %s, want 3", n, outbox.Queue)
	}
}

// A replica's lease holds its notices locked until the lease commits;
// another replica's dispatch meanwhile never leases them too (SKIP LOCKED
// passes them by; on TiDB, whose SKIP LOCKED locks nothing, the lease
// waits for the locks and then finds the notices leased): no notice is
// leased or sent twice.
func TestDispatcherNeverLeasesALeasedNoticeTwice(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t)
	declare(t, amqpURL)
	seedPayable(db, "L", 3)
	pay(t, order.NewStore(db), "L", 0, 1, 2)
	// The other replica's lease, half way: its notices read and locked,
	// their lease not written yet.
	other := db.MustBegin()
	defer other.Rollback()
	var ids []int64
	if err := other.Select(&ids, "SELECT id FROM t_outbox WHERE status = 'PENDING' FOR UPDATE"); err != nil || len(ids) != 3 {
		t.Fatalf("the other replica's lease read %v (%v), want 3 notices", ids, err)
	}
	pub := broker.NewPublisher(dial(t, amqpURL), 3*time.Second)
	defer pub.Close()
	d := &outbox.Dispatcher{DB: db, Batch: 100, Log: zap.NewNop()}
	var (
		n   int
		err error
	)
	returned := make(chan struct{})
	go func() { n, err = d.DispatchOnce(context.Background(), pub); close(returned) }()
	testenv.Eventually(t, 10*time.Second, func() bool {
		select {
		case <-returned:
			return true
		default:
		}
		var running int
		db.Get(&running, `SELECT COUNT(*) FROM information_schema.processlist
			WHERE db = DATABASE() AND info LIKE '%t_outbox%' AND id <> CONNECTION_ID()`)
		return running > 0
	}, "the dispatch neither returned nor waited for the other lease")
	q, args, qerr := sqlx.In(`UPDATE t_outbox SET attempts = attempts + 1,
		next_attempt_at = CURRENT_TIMESTAMP(3) + INTERVAL 60 SECOND WHERE id IN (?)`, ids)
	if qerr != nil {
		t.Fatal(qerr)
	}
	other.MustExec(q, args...)
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-returned:
	case <-time.After(15 * time.Second):
		t.Fatal("the dispatch did not return once the other lease committed")
	}
	if err != nil || n != 0 {
		t.Fatalf("the dispatch sent %d notices (%v) that the other replica had leased, want 0", n, err)
	}
	var attempts int
	db.Get(&attempts, "SELECT SUM(attempts) FROM t_outbox")
	if attempts != 3 {
		t.Fatalf("%d leases of 3 notices, want 3", attempts)
	}
	if depth := testenv.Depth(t, amqpURL, outbox.Queue); depth != 0 {
		t.Fatalf("%d notices in %s, want 0: the other replica sends them", depth, outbox.Queue)
	}
}

// The notices of payments a process commits are born leased to it and
// handed to its dispatcher: they are sent without a poll (the poll here
// runs once an hour) and without a second lease (attempts stays 1). A
// notice committed leased but never handed over (its process died) is
// hidden from every dispatcher until its lease ends, then polled and sent.
func TestDispatcherSendsHandedOverNoticesWithoutPolling(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t)
	for i, no := range []string{"H1", "H2", "H3"} {
		db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, 1.00)", no, i+1)
		db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (?, 10.00)", i+1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &outbox.Dispatcher{DB: db, URL: amqpURL, Name: "handoff test", Interval: time.Hour, Batch: 100,
		Log: zap.NewNop(), Handoff: make(chan []string, 16)}
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	store := order.NewStore(db)
	store.NoticeLease, store.OnCommitted = 2*time.Second, d.Offer
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.QueueExists(t, amqpURL, outbox.Queue) }, "the dispatcher declared its queue")
	for i, no := range []string{"H1", "H2"} {
		if err := store.Pay(ctx, order.Payment{OrderNo: no, UserID: int64(i + 1), Amount: 100}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		var sent int
		db.Get(&sent, "SELECT COUNT(*) FROM t_outbox WHERE status = 'SENT' AND attempts = 1")
		return sent == 2
	}, "the handed-over notices were not sent, once each, without a poll")
	if n := testenv.Depth(t, amqpURL, outbox.Queue); n != 2 {
		t.Fatalf("%d notices in %s, want 2", n, outbox.Queue)
	}

	orphan := order.NewStore(db)
	orphan.NoticeLease = 2 * time.Second // committed leased, never handed over
	if err := orphan.Pay(ctx, order.Payment{OrderNo: "H3", UserID: 3, Amount: 100}); err != nil {
		t.Fatal(err)
	}
	other := &outbox.Dispatcher{DB: db, Batch: 100, Log: zap.NewNop()}
	pub := broker.NewPublisher(dial(t, amqpURL), 3*time.Second)
	defer pub.Close()
	if n, err := other.DispatchOnce(ctx, pub); err != nil || n != 0 {
		t.Fatalf("a poll right after the commit sent %d (%v): the lease did not hide the notice", n, err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		other.DispatchOnce(ctx, pub)
		var sent int
		db.Get(&sent, "SELECT COUNT(*) FROM t_outbox WHERE biz_no = 'H3' AND status = 'SENT' AND attempts = 2")
		return sent == 1
	}, "the orphaned notice was not polled after its lease")
}

// The SENT marks of handed-over notices wait to share a statement: many
// payments committed one by one are marked in far fewer UPDATEs than
// publish batches, every one of them within the mark delay; and the marks
// still waiting when the dispatcher stops are written before Run returns.
func TestDispatcherMarksHandedOverNoticesTogether(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t)
	const n = 40
	seedPayable(db, "M", n+1)
	sent := func(where string) int {
		var c int
		db.Get(&c, "SELECT COUNT(*) FROM t_outbox WHERE status = 'SENT' AND "+where)
		return c
	}

	// No linger: each payment's notice is a publish batch of its own, so
	// that the marks, not the batches, are what is shared.
	d := &outbox.Dispatcher{DB: db, URL: amqpURL, Name: "marks test", Interval: time.Hour, Batch: 100,
		Log: zap.NewNop(), Handoff: make(chan []string, n), MarkDelay: 300 * time.Millisecond, Linger: time.Nanosecond}
	stop := runDispatcher(t, d, amqpURL)
	store := order.NewStore(db)
	store.NoticeLease, store.OnCommitted = time.Hour, d.Offer
	for i := range n {
		if err := store.Pay(context.Background(), order.Payment{OrderNo: fmt.Sprintf("M%d", i), UserID: int64(i + 1), Amount: 100}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return sent("attempts = 1") == n },
		"the handed-over notices were not all marked sent")
	stop()
	if got := testenv.Depth(t, amqpURL, outbox.Queue); got != n {
		t.Fatalf("%d notices in %s, want %d", got, outbox.Queue, n)
	}
	if d.Batches() <= n/2 {
		t.Fatalf("%d notices in %d publish batches, want more than %d: the test needs batches of their own", n, d.Batches(), n/2)
	}
	if d.Marks() > n/4 {
		t.Fatalf("%d notices marked in %d statements: the marks did not share statements", n, d.Marks())
	}

	// Stopped with a mark pending (the delay is an hour): Run marks it first.
	late := &outbox.Dispatcher{DB: db, URL: amqpURL, Name: "marks test 2", Interval: time.Hour, Batch: 100,
		Log: zap.NewNop(), Handoff: make(chan []string, 1), MarkDelay: time.Hour}
	stop = runDispatcher(t, late, amqpURL)
	store.OnCommitted = late.Offer
	if err := store.Pay(context.Background(), order.Payment{OrderNo: fmt.Sprintf("M%d", n), UserID: n + 1, Amount: 100}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Depth(t, amqpURL, outbox.Queue) == n+1 },
		"the last notice was not published")
	if c := sent(fmt.Sprintf("biz_no = 'M%d'", n)); c != 0 {
		t.Fatalf("marked before its delay (an hour)")
	}
	stop()
	if c := sent(fmt.Sprintf("biz_no = 'M%d'", n)); c != 1 {
		t.Fatalf("a notice published and pending its mark was not marked when the dispatcher stopped")
	}
}

// Handed-over notices wait out the linger to share one read and one
// publish batch: n payments committed one by one go out in a single batch
// once it holds Batch notices, however long the linger; and a dispatcher
// stopped while lingering publishes and marks what it holds before Run
// returns, instead of leaving it to the lease.
func TestDispatcherBatchesHandedOverNotices(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t)
	const n = 30
	seedPayable(db, "L", n+1)
	d := &outbox.Dispatcher{DB: db, URL: amqpURL, Name: "linger test", Interval: time.Hour, Batch: n,
		Log: zap.NewNop(), Handoff: make(chan []string, n), Linger: time.Hour}
	stop := runDispatcher(t, d, amqpURL)
	defer stop()
	store := order.NewStore(db)
	store.NoticeLease, store.OnCommitted = time.Hour, d.Offer
	for i := range n {
		if err := store.Pay(context.Background(), order.Payment{OrderNo: fmt.Sprintf("L%d", i), UserID: int64(i + 1), Amount: 100}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Depth(t, amqpURL, outbox.Queue) == n },
		"a full batch of handed-over notices was not published")
	if b := d.Batches(); b != 1 {
		t.Fatalf("%d notices handed over one by one went out in %d batches, want 1", n, b)
	}

	if err := store.Pay(context.Background(), order.Payment{OrderNo: fmt.Sprintf("L%d", n), UserID: n + 1, Amount: 100}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return len(d.Handoff) == 0 }, "the dispatcher did not take the last offer")
	stop()
	if got := testenv.Depth(t, amqpURL, outbox.Queue); got != n+1 {
		t.Fatalf("%d notices in %s after the stop, want %d: the lingering notice was not published", got, outbox.Queue, n+1)
	}
	var sent int
	db.Get(&sent, "SELECT COUNT(*) FROM t_outbox WHERE status = 'SENT' AND attempts = 1")
	if sent != n+1 {
		t.Fatalf("%d notices marked sent, want %d", sent, n+1)
	}
}

// A notice that keeps failing waits 1 s, then twice as long after each
// attempt, up to 5 minutes (the documented cap), never longer and never
// stuck below it.
func TestDispatcherBackoffStopsAtFiveMinutes(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t) // no notice exchange declared: every publish fails
	seedPayable(db, "B", 1)
	pay(t, order.NewStore(db), "B", 0)
	pub := broker.NewPublisher(dial(t, amqpURL), 3*time.Second)
	defer pub.Close()
	d := &outbox.Dispatcher{DB: db, Batch: 10, Log: zap.NewNop()}
	for _, c := range []struct {
		attempts int // before this one
		wait     time.Duration
	}{{0, time.Second}, {3, 8 * time.Second}, {8, 256 * time.Second}, {9, 300 * time.Second}, {20, 300 * time.Second}} {
		db.MustExec("UPDATE t_outbox SET attempts = ?, next_attempt_at = CURRENT_TIMESTAMP(3) - INTERVAL 1 SECOND WHERE biz_no = 'B0'", c.attempts)
		if n, err := d.DispatchOnce(context.Background(), pub); err == nil || n != 0 {
			t.Fatalf("attempt %d: sent %d, %v; want a failure", c.attempts+1, n, err)
		}
		var wait float64
		db.Get(&wait, "SELECT TIMESTAMPDIFF(MICROSECOND, CURRENT_TIMESTAMP(3), next_attempt_at) / 1e6 FROM t_outbox WHERE biz_no = 'B0'")
		if got := time.Duration(wait * float64(time.Second)); got > c.wait || got < c.wait-5*time.Second {
			t.Errorf("after attempt %d: next in %v, want %v", c.attempts+1, got.Round(time.Second), c.wait)
		}
	}
}

// A broker that never answers the connection's close (a resource alarm
// blocks it) does not hold the dispatcher's stop: the close is bounded.
func TestDispatcherStopsWhenTheBrokerNeverAnswersTheClose(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t)
	u, _ := url.Parse(amqpURL)
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	isClose := func(b []byte) bool { // connection.close: a method frame on channel 0, class 10, method 50
		return len(b) >= 11 && b[0] == 1 && b[1] == 0 && b[2] == 0 && bytes.Equal(b[7:11], []byte{0, 10, 0, 50})
	}
	proxy.BlackholeWhen(isClose)
	d := &outbox.Dispatcher{DB: db, URL: u.String(), Name: t.Name(), Interval: 50 * time.Millisecond, Batch: 10, Log: zap.NewNop()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	testenv.Eventually(t, 15*time.Second, func() bool {
		probe, err := dial(t, amqpURL).Channel()
		if err != nil {
			return false
		}
		defer probe.Close()
		_, err = probe.QueueDeclarePassive(outbox.Queue, true, false, false, false, nil)
		return err == nil
	}, "the dispatcher never declared its queue")
	start := time.Now()
	cancel()
	select {
	case <-done:
	case <-time.After(broker.CloseTimeout + 2*time.Second):
		t.Fatalf("the dispatcher still stopping after %v: its close waits for a broker that never answers", time.Since(start))
	}
}

// A resource alarm (the memory watermark set to nothing on a node of the
// test's own) blocks the dispatcher's connection at its first publish. It
// waits on that connection for the alarm to clear (paysvc_broker_blocked
// {component="outbox"} 1) instead of ending its session and dialing again
// after every publish timeout, each new connection blocked at its first
// publish; then the notice goes out and is marked SENT.
func TestDispatcherWaitsOutAResourceAlarmOnOneConnection(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	node, amqpURL := declaredNode(t)
	seedPayable(db, "ALARM", 1)
	pay(t, order.NewStore(db), "ALARM", 0)
	clearAlarm := testenv.MemoryAlarm(t, node)
	blocked := prometheus.NewGauge(prometheus.GaugeOpts{Name: "blocked"})
	core, logs := observer.New(zapcore.InfoLevel)
	d := &outbox.Dispatcher{DB: db, URL: amqpURL, Name: t.Name(), Interval: 50 * time.Millisecond, Batch: 100,
		Log: zap.New(core), Blocked: blocked}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, 30*time.Second, func() bool { return testutil.ToFloat64(blocked) == 1 },
		"the dispatcher never reported the block")
	// Past a publish timeout (10 s), the bounded close after it (5 s) and
	// a backoff: still the one session and connection.
	time.Sleep(20 * time.Second)
	if n := connections(t, node, t.Name()+" outbox"); n != 1 {
		t.Fatalf("%d dispatcher connections on the broker during the alarm, want 1", n)
	}
	if n := logs.FilterMessage("outbox dispatcher: retrying").Len(); n != 0 {
		t.Fatalf("the dispatcher ended %d sessions during the alarm, want none", n)
	}
	clearAlarm()
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		db.Get(&n, "SELECT COUNT(*) FROM t_outbox WHERE biz_no = 'ALARM0' AND status = 'SENT'")
		return n == 1
	}, "the notice was not sent once the alarm cleared")
	if testutil.ToFloat64(blocked) != 0 {
		t.Fatal("still reported blocked after the alarm")
	}
}

// A dispatcher stopped while it waits out a resource alarm returns at once
// (and its connection's bounded close): it takes no offer that arrived
// meanwhile, each of which would be a publish the blocked connection cannot
// make (10 s), before the stop. Four dispatchers at once, each with offers
// waiting when it is stopped.
func TestDispatcherStopsPromptlyInAResourceAlarm(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	node, amqpURL := declaredNode(t)
	const runs, each = 4, 4
	seedPayable(db, "S", runs*each)
	testenv.MemoryAlarm(t, node)
	took := make([]time.Duration, runs)
	errs := make(chan error, runs)
	var wg sync.WaitGroup
	for r := range runs {
		wg.Go(func() {
			d := &outbox.Dispatcher{DB: db, URL: amqpURL, Name: fmt.Sprintf("%s %d", t.Name(), r), Interval: time.Hour,
				Batch: 100, Log: zap.NewNop(), Handoff: make(chan []string, 16), Linger: time.Millisecond}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { d.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			store := order.NewStore(db)
			store.NoticeLease, store.OnCommitted = time.Hour, d.Offer
			pay := func(i int) error {
				return store.Pay(context.Background(), order.Payment{OrderNo: fmt.Sprintf("S%d", i), UserID: int64(i + 1), Amount: 100})
			}
			first := r * each
			if err := pay(first); err != nil {
				errs <- err
				return
			}
			// Its publish failed on the blocked connection and was
			// rescheduled: the dispatcher now waits for the alarm to clear.
			deadline := time.Now().Add(40 * time.Second)
			for {
				var failed int
				db.Get(&failed, "SELECT COUNT(*) FROM t_outbox WHERE biz_no = ? AND last_error <> ''", fmt.Sprintf("S%d", first))
				if failed == 1 {
					break
				}
				if time.Now().After(deadline) {
					errs <- fmt.Errorf("dispatcher %d: the first publish never failed in the alarm", r)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			for i := first + 1; i < first+each; i++ {
				if err := pay(i); err != nil {
					errs <- err
					return
				}
			}
			start := time.Now()
			cancel()
			<-done
			took[r] = time.Since(start)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for r, d := range took {
		// The connection's close is bounded at 5 s (the broker blocks it);
		// a publish taken after the stop would add its 10 s.
		if d > 9*time.Second {
			t.Errorf("dispatcher %d took %s to stop in the alarm, want under 9 s", r, d.Round(time.Millisecond))
		}
	}
}

// A notice the broker returns (no queue bound: q.pay.notify deleted or
// unbound during a migration) and confirms is not sent: it stays PENDING
// and goes out once a queue takes it, never marked SENT from a confirm
// alone.
func TestDispatcherLeavesReturnedNoticesPending(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	amqpURL := testenv.AMQP(t)
	ctx := context.Background()
	ch := declare(t, amqpURL)
	if err := ch.QueueUnbind(outbox.Queue, "pay.#", outbox.Exchange, nil); err != nil {
		t.Fatal(err)
	}
	seedPayable(db, "U", 3)
	pay(t, order.NewStore(db), "U", 0, 1, 2)
	count := func(status string) (n int) {
		db.Get(&n, "SELECT COUNT(*) FROM t_outbox WHERE status = ?", status)
		return n
	}
	d := &outbox.Dispatcher{DB: db, Batch: 100, Log: zap.NewNop()}
	pub := broker.NewPublisher(dial(t, amqpURL), 5*time.Second)
	defer pub.Close()
	if n, err := d.DispatchOnce(ctx, pub); n != 0 || !errors.Is(err, broker.ErrUnroutable) {
		t.Fatalf("DispatchOnce with no queue bound = %d, %v; want 0 sent and ErrUnroutable", n, err)
	}
	if sent, pending := count("SENT"), count("PENDING"); sent != 0 || pending != 3 {
		t.Fatalf("after the returns: %d SENT, %d PENDING; want 0 and 3", sent, pending)
	}
	if err := ch.QueueBind(outbox.Queue, "pay.#", outbox.Exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		d.DispatchOnce(ctx, pub) // the returned ones are due again after their backoff (1 s)
		return count("SENT") == 3
	}, "the returned notices were not sent once a queue was bound")
	if n := testenv.Depth(t, amqpURL, outbox.Queue); n != 3 {
		t.Fatalf("%d notices in %s, want 3", n, outbox.Queue)
	}
}

// connections counts node's client connections named name.
func connections(t *testing.T, node, name string) int {
	n := 0
	for _, line := range strings.Split(testenv.RabbitCtl(t, node, "list_connections", "--no-table-headers", "client_properties"), "\n") {
		if strings.Contains(line, `"`+name+`"`) {
			n++
		}
	}
	return n
}

// seedPayable inserts n INIT orders of 1.00, prefix0 to prefix<n-1>, the
// i-th for user i+1, and each user's account holding 10.00.
func seedPayable(db *sqlx.DB, prefix string, n int) {
	for i := range n {
		db.MustExec("INSERT INTO t_order (order_no, user_id, amount) VALUES (?, ?, 1.00)", fmt.Sprintf("%s%d", prefix, i), i+1)
		db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (?, 10.00)", i+1)
	}
}

// runDispatcher runs d until the returned stop (which waits for Run to
// return, and may be called again); it returns once d has declared its
// queue.
func runDispatcher(t *testing.T, d *outbox.Dispatcher, amqpURL string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.QueueExists(t, amqpURL, outbox.Queue) }, "the dispatcher declared its queue")
	return sync.OnceFunc(func() { cancel(); <-done })
}

// pay pays the orders of seedPayable with these indexes through store,
// the payments' own write path: each payment's transaction writes its
// notice (PENDING and due at once, unless store has a NoticeLease).
func pay(t *testing.T, store *order.Store, prefix string, indexes ...int) {
	t.Helper()
	for _, i := range indexes {
		p := order.Payment{OrderNo: fmt.Sprintf("%s%d", prefix, i), UserID: int64(i + 1), Amount: 100}
		if err := store.Pay(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
}
