package listener_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// returnIt takes the next message of queue and gives it back (nack with
// requeue): a failed delivery, as a consumer that dies holding it.
func returnIt(t *testing.T, ch *amqp.Channel, queue string) bool {
	t.Helper()
	d, ok, err := ch.Get(queue, false)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		d.Nack(false, true)
	}
	return ok
}

// Every quorum queue has an explicit delivery limit and a dead-letter
// target, so that no limit drops a message (RabbitMQ 4.x drops a message
// past the default limit of 20 when there is none). Shown here on 3.10
// with small limits: a terminal message returned past its limit moves to
// the overflow queue and is still parked; a notice its consumer keeps
// returning moves to q.pay.notify.dead.
func TestNoDeliveryLimitDropsAMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch := e.channel()
	if err := listener.DeclareTopology(ch, listener.Topology{Delays: e.delays, TerminalDeliveryLimit: 1}); err != nil {
		t.Fatal(err)
	}
	testenv.Publish(t, e.amqpURL, listener.TerminalQueue, []byte(`{"orderNo":"OVF1","userId":1,"amount":"1.00"}`))
	testenv.Eventually(t, 10*time.Second, func() bool {
		returnIt(t, ch, listener.TerminalQueue)
		return e.depth(listener.OverflowQueue) == 1
	}, "the terminal message past its limit did not reach the overflow queue")
	p := &listener.Parker{URL: e.amqpURL, Name: t.Name(), Store: deadletter.NewStore(e.db), Log: e.log, TerminalDeliveryLimit: 1}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters("order_no = 'OVF1'")) == 1 },
		"the parker did not park the overflowed message")
	cancel()
	<-done
	if got := e.deadLetters("order_no = 'OVF1'")[0]; got.ErrorClass != listener.ClassDeadLettered ||
		!strings.Contains(got.LastError, "delivery_limit from q.pay.dlx.terminal") {
		t.Fatalf("parked as %s: %s", got.ErrorClass, got.LastError)
	}

	if err := outbox.Declare(ch); err != nil {
		t.Fatal(err)
	}
	testenv.Publish(t, e.amqpURL, outbox.Queue, []byte(`{"event":"PAYMENT_SUCCEEDED"}`))
	testenv.Eventually(t, 20*time.Second, func() bool {
		returnIt(t, ch, outbox.Queue)
		return e.depth(outbox.DeadQueue) == 1
	}, "a notice returned past its limit did not reach %s", outbox.DeadQueue)
}

// The monitor measures without reading: after many samples the message at
// the head of a quorum main queue (limit 2) has never been delivered.
func TestMonitorNeverReadsAQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch := e.channel()
	if err := listener.DeclareTopology(ch, listener.Topology{Delays: e.delays, DeliveryLimit: 2}); err != nil {
		t.Fatal(err)
	}
	e.publish(body("MON1", 1, "1.00"))
	m := metrics.New()
	mon := &listener.Monitor{URL: e.amqpURL, Name: t.Name(), Delays: e.delays, Store: deadletter.NewStore(e.db),
		DB: e.db, Metrics: m, Log: zap.NewNop()}
	for range 5 {
		if err := mon.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if e.depth(listener.TerminalQueue) != 0 || e.depth(listener.MainQueue) != 1 {
		t.Fatal("sampling moved the message")
	}
	d, ok, err := ch.Get(listener.MainQueue, true)
	if err != nil || !ok {
		t.Fatalf("get: %v %v", ok, err)
	}
	if c := fmt.Sprint(d.Headers["x-delivery-count"]); d.Redelivered || (c != "<nil>" && c != "0") {
		t.Fatalf("the head message was delivered before: redelivered %v, x-delivery-count %v", d.Redelivered, d.Headers["x-delivery-count"])
	}
}

// A q.pay.success left classic by an earlier version stops start-up with a
// message that says what to do, naming amqp.queueType and the migration.
func TestClassicMainQueueStopsStartup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch := e.channel()
	if err := listener.DeclareTopology(ch, listener.Topology{Delays: e.delays, MainQueueType: "classic"}); err != nil {
		t.Fatal(err)
	}
	c := e.start(e.redisAddr, e.dsn) // quorum, the default
	err := c.wait(t)
	if err == nil || !strings.Contains(err.Error(), "amqp.queueType") || !strings.Contains(err.Error(), "Migrating to quorum queues") {
		t.Fatalf("Run = %v, want the queue type mismatch explained, with the migration", err)
	}
}

// A retry copy back from a wait queue entered the main queue when its wait
// ended, not when the payment was first published (the copy keeps that
// timestamp, here an hour old): retries do not age the main queue. Each
// wait queue's entry time is when the copy was published to it.
func TestRetryCopiesAgeTheQueuesFromTheirWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(7, "5.00")
	e.seedOrder("AGE1", 7, "199.00")
	start := time.Now()
	if err := e.ch.PublishWithContext(context.Background(), "", listener.MainQueue, false, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent, Timestamp: start.Add(-time.Hour), Body: body("AGE1", 7, "199.00")}); err != nil {
		t.Fatal(err)
	}
	c := e.start(e.redisAddr, e.dsn)
	e.waitResults(20*time.Second, func(r map[string]int) bool { return r["TERMINAL"] == 1 }, "never reached terminal")
	// The last copy came back from the second wait queue.
	if last := c.LastEnqueued(); last.Before(start) {
		t.Fatalf("LastEnqueued %s, before the test began: a retry copy aged the main queue by its first publish",
			start.Sub(last).Round(time.Second))
	}
	w0, w1 := c.WaitEntered(listener.WaitQueue(e.delays[0])), c.WaitEntered(listener.WaitQueue(e.delays[1]))
	if w0.Before(start) || w1.Before(w0) || w1.After(time.Now()) {
		t.Fatalf("wait queues entered at %s and %s; want in order, within the test (began %s)", w0, w1, start)
	}
}

// The monitor reports a wait queue's oldest copy from when the newest copy
// back from it entered it (a queue with one TTL keeps its copies in
// order), without reading the queue, and 0 for an empty one.
func TestMonitorAgesWaitQueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch := e.channel()
	delays := []time.Duration{time.Hour, 2 * time.Hour}
	if err := listener.DeclareTopology(ch, listener.Topology{Delays: delays}); err != nil {
		t.Fatal(err)
	}
	testenv.Publish(t, e.amqpURL, listener.WaitQueue(time.Hour), body("AGE2", 1, "1.00"))
	m := metrics.New()
	entered := time.Now().Add(-10 * time.Minute)
	mon := &listener.Monitor{URL: e.amqpURL, Name: t.Name(), Delays: delays, Store: deadletter.NewStore(e.db),
		DB: e.db, Metrics: m, Log: zap.NewNop(), Consumer: enteredAt{entered}}
	if err := mon.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if age := testutil.ToFloat64(m.QueueOldestAge.WithLabelValues(listener.WaitQueue(time.Hour))); age < 600 || age > 660 {
		t.Fatalf("%s's age %.0f s, want about 600", listener.WaitQueue(time.Hour), age)
	}
	if age := testutil.ToFloat64(m.QueueOldestAge.WithLabelValues(listener.WaitQueue(2 * time.Hour))); age != 0 {
		t.Fatalf("an empty wait queue's age %.0f s, want 0", age)
	}
	if e.depth(listener.WaitQueue(time.Hour)) != 1 {
		t.Fatal("sampling moved the copy")
	}
}

// enteredAt answers the monitor as a consumer that received its last copy
// from every wait queue having entered it at t.
type enteredAt struct{ t time.Time }

func (a enteredAt) LastEnqueued() time.Time      { return time.Time{} }
func (a enteredAt) WaitEntered(string) time.Time { return a.t }

// A broker that stops answering (black-holed: no reply, no reset) does not
// hold the monitor past its context's end: a shutdown waits for it.
func TestMonitorLetsGoOfABlackholedBroker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := listener.DeclareTopology(e.channel(), listener.Topology{Delays: e.delays}); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	mon := &listener.Monitor{URL: u.String(), Name: t.Name(), Delays: e.delays, Store: deadletter.NewStore(e.db),
		DB: e.db, Metrics: metrics.New(), Log: zap.NewNop()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := mon.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.BlackholeWhen(func([]byte) bool { return true })
	done := make(chan error, 1)
	go func() { done <- mon.Poll(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("Poll through a black-holed broker returned (%v) before the context ended: the test proves nothing", err)
	case <-time.After(time.Second):
	}
	cancel()
	select {
	case <-done:
	case <-time.After(broker.CloseTimeout + 3*time.Second):
		t.Fatal("the monitor held on to a black-holed broker past its context's end")
	}
}

// A database outage is not a broker failure: the monitor keeps its broker
// connection and goes on measuring the queues (what matters most while the
// database is down), and counts no reconnect, which would fire
// PaysvcReconnectStorm on every replica.
func TestMonitorKeepsMeasuringQueuesWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := listener.DeclareTopology(e.channel(), listener.Topology{Delays: e.delays}); err != nil {
		t.Fatal(err)
	}
	down, err := sqlx.Open("mysql", e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	down.Close() // every query fails: "sql: database is closed"
	m := metrics.New()
	mon := &listener.Monitor{URL: e.amqpURL, Name: t.Name(), Delays: e.delays, Store: deadletter.NewStore(down),
		DB: down, Metrics: m, Log: zap.NewNop(), Interval: 10 * time.Millisecond}
	if err := mon.Poll(context.Background()); err == nil {
		t.Fatal("Poll without a database returned no error: the test proves nothing")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); mon.Run(ctx) }()
	defer func() { cancel(); <-done }()
	e.publish(body("MON2", 1, "1.00"), body("MON3", 1, "1.00"))
	testenv.Eventually(t, 10*time.Second, func() bool {
		return testutil.ToFloat64(m.QueueMessages.WithLabelValues(listener.MainQueue)) == 2
	}, "the main queue's depth was not measured while the database was down")
	if n := testutil.ToFloat64(m.Reconnects.WithLabelValues("monitor")); n != 0 {
		t.Fatalf("%v monitor reconnects counted for a database outage, want 0", n)
	}
}

// The monitor reports the oldest unpublished notice's age, on the
// database's clock, and 0 once none is pending: the NoticesPending alert
// reads the age, which does not grow with the number of replicas.
func TestMonitorAgesTheOldestPendingNotice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := listener.DeclareTopology(e.channel(), listener.Topology{Delays: e.delays}); err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	mon := &listener.Monitor{URL: e.amqpURL, Name: t.Name(), Delays: e.delays, Store: deadletter.NewStore(e.db),
		DB: e.db, Metrics: m, Log: zap.NewNop()}
	poll := func() (pending, age float64) {
		t.Helper()
		if err := mon.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
		return testutil.ToFloat64(m.OutboxPending), testutil.ToFloat64(m.OutboxOldestAge)
	}
	if n, age := poll(); n != 0 || age != 0 {
		t.Fatalf("no notice: pending %v, age %v; want 0, 0", n, age)
	}
	notice := func(bizNo, status string, age time.Duration) {
		e.db.MustExec(`INSERT INTO t_outbox (event_type, biz_no, payload, status, create_time)
			VALUES ('PAY_SUCCESS', ?, '{}', ?, NOW(3) - INTERVAL ? MICROSECOND)`, bizNo, status, age.Microseconds())
	}
	notice("N1", "SENT", 3*time.Hour) // published: not pending, however old
	notice("N2", "PENDING", 20*time.Minute)
	notice("N3", "PENDING", time.Minute)
	n, age := poll()
	if n != 2 || age < (20*time.Minute).Seconds() || age > (21*time.Minute).Seconds() {
		t.Fatalf("pending %v, oldest age %vs; want 2 and about 1200s (N2's)", n, age)
	}
	e.db.MustExec("UPDATE t_outbox SET status = 'SENT' WHERE biz_no = 'N2'")
	if n, age := poll(); n != 1 || age < 60 || age > 120 {
		t.Fatalf("after N2 went out: pending %v, oldest age %vs; want 1 and about 60s (N3's)", n, age)
	}
	e.db.MustExec("UPDATE t_outbox SET status = 'SENT' WHERE biz_no = 'N3'")
	if n, age := poll(); n != 0 || age != 0 {
		t.Fatalf("all sent: pending %v, age %v; want 0, 0", n, age)
	}
}

// While the database is down, paysvc_terminal_pending still counts what
// reaches the terminal queue (the dead letters as last seen, the queue as
// it is now): the TerminalMessages alert must not go blind in an outage.
func TestTerminalPendingCountsTheQueueWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := listener.DeclareTopology(e.channel(), listener.Topology{Delays: e.delays}); err != nil {
		t.Fatal(err)
	}
	store := deadletter.NewStore(e.db)
	now := time.Now()
	if _, _, err := store.Park(context.Background(), deadletter.Parked{OrderNo: "TP1", Body: []byte("{}"), Headers: "{}",
		ErrorClass: "malformed", LastError: "test", FirstFailedAt: now, LastFailedAt: now}); err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	mon := &listener.Monitor{URL: e.amqpURL, Name: t.Name(), Delays: e.delays, Store: store,
		DB: e.db, Metrics: m, Log: zap.NewNop()}
	if err := mon.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.TerminalPending); got != 1 {
		t.Fatalf("paysvc_terminal_pending %v with one NEW dead letter, want 1", got)
	}
	down, err := sqlx.Open("mysql", e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	down.Close() // every query fails
	mon.DB, mon.Store = down, deadletter.NewStore(down)
	testenv.Publish(t, e.amqpURL, listener.TerminalQueue, []byte("a"), []byte("b"))
	if err := mon.Poll(context.Background()); err == nil {
		t.Fatal("Poll without a database returned no error: the test proves nothing")
	}
	if got := testutil.ToFloat64(m.TerminalPending); got != 3 {
		t.Fatalf("paysvc_terminal_pending %v during the outage, want 3 (1 dead letter as last seen, 2 in the queue)", got)
	}

	// The parker takes one and holds it (it cannot park it): unacked, no
	// depth counts it, the monitor must.
	parker := &listener.Parker{URL: e.amqpURL, Name: t.Name(), Store: deadletter.NewStore(down), Log: zap.NewNop(),
		Timeout: time.Second}
	mon.Parker = parker
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); parker.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, 10*time.Second, func() bool { return parker.Holding() == 1 }, "the parker never took a message")
	testenv.Eventually(t, 10*time.Second, func() bool { return e.depth(listener.TerminalQueue) == 1 },
		"the terminal queue does not hold the other message (the parker took more than it holds)")
	mon.Poll(context.Background())
	if got := testutil.ToFloat64(m.TerminalPending); got != 3 {
		t.Fatalf("paysvc_terminal_pending %v with the parker holding one, want 3 (1 dead letter, 1 queued, 1 held)", got)
	}
}

// The parker takes a message of each of its queues (parkerPrefetch per
// consumer): through a database outage it holds the one it tries to park,
// and the other queue's waits in its hands behind it. Both are unacked, in
// no queue's depth, and paysvc_terminal_pending counts them, whichever
// queue they came from; each once when the parker stops (back in their
// queues) and once parked (NEW dead letters).
func TestTerminalPendingCountsWhatTheParkerHolds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := listener.DeclareTopology(e.channel(), listener.Topology{Delays: e.delays}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	proxy, proxied := testenv.MySQLProxy(t, e.dsn)
	db, err := sqldb.Open(ctx, proxied, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store := deadletter.NewStore(db)
	m := metrics.New()
	mon := &listener.Monitor{URL: e.amqpURL, Name: t.Name(), Delays: e.delays, Store: store, DB: db, Metrics: m, Log: zap.NewNop()}
	startParker := func() (*listener.Parker, func()) {
		p := &listener.Parker{URL: e.amqpURL, Name: t.Name(), Store: store, Log: e.log, Timeout: time.Second}
		mon.Parker = p
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); p.Run(pctx) }()
		stop := func() { cancel(); <-done }
		t.Cleanup(stop)
		return p, stop
	}
	pending := func(wantDBErr bool) float64 {
		t.Helper()
		if err := mon.Poll(ctx); (err != nil) != wantDBErr {
			t.Fatalf("Poll: %v; want an error %v", err, wantDBErr)
		}
		return testutil.ToFloat64(m.TerminalPending)
	}

	proxy.Down()
	testenv.Publish(t, e.amqpURL, listener.TerminalQueue, []byte(`{"orderNo":"PH1","userId":1,"amount":"1.00"}`))
	testenv.Publish(t, e.amqpURL, listener.OverflowQueue, []byte(`{"orderNo":"PH2","userId":1,"amount":"1.00"}`))
	if got := pending(true); got != 2 {
		t.Fatalf("paysvc_terminal_pending %v with a message in each queue, want 2", got)
	}
	parker, stop := startParker()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return e.depth(listener.TerminalQueue) == 0 && e.depth(listener.OverflowQueue) == 0 &&
			len(e.logs.FilterMessage("parker: cannot park; holding the message and trying again").All()) > 0
	}, "the parker did not take both messages and hold one through the outage")
	if got := pending(true); got != 2 {
		t.Fatalf("paysvc_terminal_pending %v with the parker holding a terminal and an overflow message, want 2 (parker says %d)",
			got, parker.Holding())
	}

	stop() // the messages in hand go back to their queues
	testenv.Eventually(t, 10*time.Second, func() bool {
		return e.depth(listener.TerminalQueue) == 1 && e.depth(listener.OverflowQueue) == 1
	}, "the messages in the stopped parker's hands are not back in their queues")
	if got := pending(true); got != 2 {
		t.Fatalf("paysvc_terminal_pending %v with the parker stopped and both messages queued, want 2 (parker says %d)",
			got, parker.Holding())
	}

	proxy.Up()
	parker, _ = startParker()
	testenv.Eventually(t, 20*time.Second, func() bool {
		var n int
		return e.db.Get(&n, "SELECT COUNT(*) FROM t_dead_letter WHERE status = 'NEW'") == nil && n == 2
	}, "the messages were not parked once the database came back")
	testenv.Eventually(t, 5*time.Second, func() bool { return parker.Holding() == 0 },
		"the parker still counts messages it has parked as in its hands")
	if got := pending(false); got != 2 {
		t.Fatalf("paysvc_terminal_pending %v with both messages parked, want 2 NEW dead letters (parker says %d)",
			got, parker.Holding())
	}
}
