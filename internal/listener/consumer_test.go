package listener_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/logging"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/scratch"
	"github.com/paysvc/paysvc/internal/testenv"
)

func TestAppliesOnceAndAcksDuplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(10086, "1000.00")
	e.seedOrder("P20260928001", 10086, "199.00")
	msg := body("P20260928001", 10086, "199.00")
	e.publish(msg, msg, msg)
	c := e.start(e.redisAddr, e.dsn)

	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["FIRST"]+r["DUPLICATE"] == 3 },
		"three deliveries of one payment were not all acked")
	if r := e.results(); r["FIRST"] != 1 || r["DUPLICATE"] != 2 {
		t.Fatalf("outcomes %v, want 1 FIRST and 2 DUPLICATE", r)
	}
	if e.status("P20260928001") != order.Paid || e.flows("P20260928001") != 1 || e.balance(10086) != 80100 {
		t.Fatalf("status %s, %d flows, balance %s; want PAID, 1, 801.00",
			e.status("P20260928001"), e.flows("P20260928001"), e.balance(10086))
	}
	if v := e.rdb.Get(context.Background(), e.prefix+"P20260928001").Val(); v != "done" {
		t.Fatalf("redis key = %q, want done", v)
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if n := e.depth(listener.MainQueue); n != 0 {
		t.Fatalf("%d messages left in the main queue", n)
	}
}

// The consumer and the parker ask the broker for their own delivery
// timeout (x-consumer-timeout): on RabbitMQ 3.12+ it replaces the server's
// consumer_timeout (30 min by default), past which a delivery held through
// an outage is taken back with a delivery count, the channel closed.
// RabbitMQ 3.10 lists the argument and ignores it.
func TestConsumerAsksForItsDeliveryTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	c := e.start(e.redisAddr, e.dsn, func(c *setup) { c.ConsumerTimeout = 90 * time.Minute })
	defer c.stop()
	stopParker := e.startParker(deadletter.NewStore(e.db), 0) // 90 min too
	defer stopParker()
	u, err := url.Parse(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	queues := []string{listener.MainQueue, listener.TerminalQueue, listener.OverflowQueue}
	var listed string
	testenv.Eventually(t, 10*time.Second, func() bool {
		listed, err = scratch.RabbitmqCtlOutput("list_consumers", "-p", strings.TrimPrefix(u.Path, "/"), "queue_name", "arguments")
		return err == nil && strings.Count(listed, "\n") > len(queues)
	}, "the consumers were never listed")
	for _, q := range queues {
		found := false
		for _, line := range strings.Split(listed, "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == q {
				found = strings.Contains(line, "x-consumer-timeout") && strings.Contains(line, "5400000")
			}
		}
		if !found {
			t.Errorf("%s's consumer does not ask for x-consumer-timeout 5400000 (90 min): %q", q, listed)
		}
	}
}

// Duplicates delivered concurrently to two consumers apply once.
func TestTwoConsumersDuplicateStormAppliesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	const orders, copies = 40, 3
	var msgs [][]byte
	for u := int64(1); u <= 4; u++ {
		e.seedAccount(u, "10000.00")
	}
	for i := range orders {
		no := fmt.Sprintf("S%03d", i)
		e.seedOrder(no, int64(i%4+1), "12.34")
		for range copies {
			msgs = append(msgs, body(no, int64(i%4+1), "12.34"))
		}
	}
	e.publish(msgs...)
	// One consumer groups payments into shared transactions, the other runs
	// each alone.
	e.start(e.redisAddr, e.dsn, func(c *setup) { c.Workers, c.Prefetch = 16, 32 })
	e.start(e.redisAddr, e.dsn, func(c *setup) { c.GroupSize = 1 })

	e.waitResults(30*time.Second, func(r map[string]int) bool { return r["FIRST"]+r["DUPLICATE"] == orders*copies },
		"not every delivery was settled")
	if r := e.results(); r["FIRST"] != orders || r["TERMINAL"] != 0 {
		t.Fatalf("outcomes %v, want %d FIRST and no TERMINAL", r, orders)
	}
	if n := e.totalFlows(); n != orders {
		t.Fatalf("%d flows, want %d", n, orders)
	}
	for u := int64(1); u <= 4; u++ {
		if b := e.balance(u); b != 1000000-10*1234 {
			t.Errorf("user %d balance %s, want %s", u, b, money.Cents(1000000-10*1234))
		}
	}
}

// Insufficient balance walks the wait queues, then lands in the terminal
// queue with the headers, and changes nothing.
func TestInsufficientBalanceWalksWaitQueuesToTerminal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(7, "5.00")
	e.seedOrder("LOW1", 7, "199.00")
	msg := body("LOW1", 7, "199.00")
	e.publish(msg)
	e.start(e.redisAddr, e.dsn)

	e.waitResults(20*time.Second, func(r map[string]int) bool { return r["TERMINAL"] == 1 }, "never reached terminal")
	var attempts []int
	for _, entry := range e.logs.FilterMessage("message handled").All() {
		m := entry.ContextMap()
		if m["error_class"] != "balance_not_enough" {
			t.Errorf("error_class %v, want balance_not_enough", m["error_class"])
		}
		attempts = append(attempts, int(m["attempt"].(int64)))
	}
	if fmt.Sprint(attempts) != "[1 2 3 3]" {
		t.Fatalf("attempts %v, want RETRY 1, 2, 3 then TERMINAL at 3", attempts)
	}
	got := e.getAll(listener.TerminalQueue)
	if len(got) != 1 {
		t.Fatalf("%d terminal messages, want 1", len(got))
	}
	d := got[0]
	if string(d.Body) != string(msg) || d.DeliveryMode != amqp.Persistent {
		t.Errorf("terminal copy body %q mode %d, want the original, persistent", d.Body, d.DeliveryMode)
	}
	if d.Headers[listener.HeaderRetryCount] != int32(3) ||
		d.Headers[listener.HeaderErrorClass] != "balance_not_enough" ||
		!strings.Contains(fmt.Sprint(d.Headers[listener.HeaderLastError]), "balance not enough") ||
		!strings.Contains(fmt.Sprint(d.Headers[listener.HeaderLastError]), "gave up after 3 retries") ||
		d.Headers[listener.HeaderFirstFailedAt] == nil {
		t.Errorf("terminal headers %v", d.Headers)
	}
	if e.status("LOW1") != order.Init || e.balance(7) != 500 || e.flows("LOW1") != 0 {
		t.Fatal("a failed payment changed data")
	}
	for _, q := range []string{listener.MainQueue, listener.WaitQueue(e.delays[0]), listener.WaitQueue(e.delays[1])} {
		if n := e.depth(q); n != 0 {
			t.Errorf("%s holds %d messages", q, n)
		}
	}
	if k := e.rdb.Exists(context.Background(), e.prefix+"LOW1").Val(); k != 0 {
		t.Error("a failed payment left its redis key: the retry could not claim it")
	}
}

// A payment whose balance is topped up while it waits is applied on retry.
func TestRetryAppliesAfterTopUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(8, "1.00")
	e.seedOrder("TOP1", 8, "2.00")
	e.publish(body("TOP1", 8, "2.00"))
	e.start(e.redisAddr, e.dsn, func(c *setup) { c.Retry.MaxAttempts = 100 })
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["RETRY"] >= 1 }, "no retry")
	e.db.MustExec("UPDATE t_account SET balance = balance + 5 WHERE user_id = 8")
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["FIRST"] == 1 }, "not applied after top-up")
	if e.balance(8) != 400 || e.flows("TOP1") != 1 {
		t.Fatalf("balance %s, %d flows; want 4.00, 1", e.balance(8), e.flows("TOP1"))
	}
}

// Every kind of bad input reaches the terminal queue at once, with its
// class, and changes nothing.
func TestBadInputGoesTerminalAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(1, "100.00")
	e.seedOrder("OK1", 1, "10.00")
	e.seedOrder("REF1", 1, "10.00")
	e.db.MustExec("UPDATE t_order SET status = 'REFUNDED' WHERE order_no = 'REF1'")
	cases := []struct {
		body  string
		class string
	}{
		{`not json`, "bad_message"},
		{`{"orderNo":"OK1","userId":1,"amount":10.00} trailing`, "bad_message"},
		{`{"orderNo":"OK1","userId":1,"amount":10.00}{}`, "bad_message"},
		{`{"orderNo":"OK1","orderNo":"OK1","userId":1,"amount":10.00}`, "bad_message"},
		{`{"orderno":"OK1","userId":1,"amount":10.00}`, "bad_message"},
		{`{"orderNo":"OK1","userId":1}`, "bad_message"},
		{`{"orderNo":"OK1","userId":1,"amount":null}`, "bad_message"},
		{`{"orderNo":"OK1","userId":1,"amount":10.001}`, "bad_message"},
		{`{"orderNo":"OK1","userId":1,"amount":-10.00}`, "bad_message"},
		{`{"orderNo":"OK1","userId":1,"amount":0}`, "bad_message"},
		{`{"orderNo":"OK1","userId":1,"amount":1e1}`, "bad_message"},
		{`{"orderNo":"OK1","userId":"1","amount":10.00}`, "bad_message"},
		{`{"orderNo":"O K","userId":1,"amount":10.00}`, "bad_message"},
		{`[1,2,3]`, "bad_message"},
		{`{"orderNo":"OK1","userId":1,"amount":"10.00","pad":"` + strings.Repeat("x", listener.MaxBody) + `"}`, "bad_message"},
		{`{"orderNo":"OK1","userId":2,"amount":10.00}`, "mismatch"},
		{`{"orderNo":"OK1","userId":1,"amount":"9.99"}`, "mismatch"},
		{`{"orderNo":"REF1","userId":1,"amount":99.00}`, "mismatch"},
	}
	for _, c := range cases {
		e.publish([]byte(c.body))
	}
	e.start(e.redisAddr, e.dsn)
	e.waitResults(15*time.Second, func(r map[string]int) bool { return r["TERMINAL"] == len(cases) }, "bad input not all terminal")
	if r := e.results(); len(r) != 1 {
		t.Fatalf("outcomes %v, want only TERMINAL", r)
	}
	got := e.getAll(listener.TerminalQueue)
	if len(got) != len(cases) {
		t.Fatalf("%d terminal messages, want %d", len(got), len(cases))
	}
	want := map[string]string{}
	for _, c := range cases {
		want[c.body] = c.class
	}
	for _, d := range got {
		if cls := d.Headers[listener.HeaderErrorClass]; cls != want[string(d.Body)] {
			t.Errorf("body %.60q: class %v, want %s", d.Body, cls, want[string(d.Body)])
		}
		if text, ok := d.Headers[listener.HeaderLastError].(string); d.Headers[listener.HeaderRetryCount] != int32(0) || !ok || text == "" {
			t.Errorf("body %.60q: headers %v", d.Body, d.Headers)
		}
	}
	if e.totalFlows() != 0 || e.balance(1) != 10000 || e.status("OK1") != order.Init {
		t.Fatal("bad input changed data")
	}
}

// A copy of a payment whose order was refunded since (a redelivery, a
// replay): the payment was applied once, so the copy is a duplicate, acked,
// not parked and not alerted, and nothing changes.
func TestRefundedOrderCopyIsADuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(4, "10.00")
	e.seedOrder("RFD1", 4, "3.00")
	e.db.MustExec("UPDATE t_order SET status = 'REFUNDED' WHERE order_no = 'RFD1'")
	e.start(e.redisAddr, e.dsn)
	e.publish(body("RFD1", 4, "3.00"), body("RFD1", 4, "3.00"))
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["DUPLICATE"] == 2 }, "copies of a refunded payment not acked as duplicates")
	if r := e.results(); len(r) != 1 || e.depth(listener.TerminalQueue) != 0 {
		t.Fatalf("outcomes %v, terminal queue %d: want only DUPLICATE", r, e.depth(listener.TerminalQueue))
	}
	if e.flows("RFD1") != 0 || e.balance(4) != 1000 || e.status("RFD1") != order.Refunded {
		t.Fatal("a copy of a refunded payment changed data")
	}
}

// Redis says "done" but the database shows no payment (a restored database,
// a key written by something else): the message is applied, not dropped.
func TestDoneKeyWithoutPaymentIsNotDropped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(3, "50.00")
	e.seedOrder("GHOST", 3, "5.00")
	e.rdb.Set(context.Background(), e.prefix+"GHOST", "done", time.Hour)
	e.publish(body("GHOST", 3, "5.00"))
	e.start(e.redisAddr, e.dsn)
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["FIRST"] == 1 }, "payment not applied")
	if e.flows("GHOST") != 1 || e.balance(3) != 4500 {
		t.Fatal("payment not applied exactly once")
	}
	if len(e.logs.FilterMessageSnippet("disagree").All()) != 1 {
		t.Fatal("the disagreement was not logged")
	}
	if n := testutil.ToFloat64(e.metrics.Disagreements.WithLabelValues("redis_done_db_unpaid")); n != 1 {
		t.Fatalf("disagreement metric %v, want 1", n)
	}
}

// A key holding a value paysvc never writes, as the hand-written consumer
// it replaces leaves (SET key 1 NX EX 86400, its transaction then failed or
// its process died), or a key of another type: the database decides at
// once. An unpaid order is paid on its first delivery, not retried until the
// legacy key expires a day later; a paid one is a duplicate. The keys are
// left as they were.
func TestForeignKeyValueLeavesItToTheDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(5, "50.00")
	e.seedOrder("LEGACY1", 5, "5.00")
	e.seedOrder("LEGACY2", 5, "7.00")
	e.seedOrder("LEGPAID", 5, "1.00")
	e.db.MustExec("UPDATE t_order SET status = 'PAID' WHERE order_no = 'LEGPAID'")
	ctx := context.Background()
	e.rdb.Set(ctx, e.prefix+"LEGACY1", "1", 24*time.Hour)
	e.rdb.HSet(ctx, e.prefix+"LEGACY2", "by", "someone")
	e.rdb.Set(ctx, e.prefix+"LEGPAID", "1", 24*time.Hour)
	e.publish(body("LEGACY1", 5, "5.00"), body("LEGACY2", 5, "7.00"), body("LEGPAID", 5, "1.00"))
	e.start(e.redisAddr, e.dsn)
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["FIRST"] == 2 && r["DUPLICATE"] == 1 },
		"legacy keys not left to the database")
	if r := e.results(); r["RETRY"] != 0 || r["TERMINAL"] != 0 {
		t.Fatalf("outcomes %v: a legacy key was waited out as another worker's lease", r)
	}
	if e.flows("LEGACY1") != 1 || e.flows("LEGACY2") != 1 || e.flows("LEGPAID") != 0 || e.balance(5) != 3800 {
		t.Fatal("payments not applied exactly once")
	}
	if n := testutil.ToFloat64(e.metrics.Disagreements.WithLabelValues("redis_foreign_db_unpaid")); n != 2 {
		t.Fatalf("foreign-value metric %v, want 2", n)
	}
	if v := e.rdb.Get(ctx, e.prefix+"LEGACY1").Val(); v != "1" {
		t.Fatalf("legacy key now %q, want it left as it was", v)
	}
}

// A key in flight elsewhere (a worker that died) never acks an unpaid
// message: it is retried, and applied once the lease is gone.
func TestInFlightKeyRetriesThenApplies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(4, "50.00")
	e.seedOrder("HELD", 4, "5.00")
	// The dead worker's lease outlives every retry delay (200ms, 300ms) and
	// all three attempts together: waiting it out must not spend them.
	e.rdb.Set(context.Background(), e.prefix+"HELD", "inflight:dead-worker", 2*time.Second)
	e.publish(body("HELD", 4, "5.00"))
	e.start(e.redisAddr, e.dsn)
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["FIRST"] == 1 }, "payment not applied")
	retries := e.logs.FilterMessage("message handled").FilterField(zap.String("error_class", "in_flight")).All()
	if len(retries) == 0 {
		t.Fatal("the in-flight key did not route the message to retry first")
	}
	for _, r := range retries {
		if r.ContextMap()["attempt"] != int64(0) {
			t.Fatalf("an in-flight retry spent an attempt: %v", r.ContextMap())
		}
	}
	if r := e.results(); r["TERMINAL"] != 0 {
		t.Fatalf("outcomes %v: waiting out a lease sent the payment to terminal", r)
	}
	if e.flows("HELD") != 1 || e.balance(4) != 4500 {
		t.Fatal("payment not applied exactly once")
	}
}

// Redis down under CLOSED: messages stay in the broker, no attempt is spent,
// and they drain once Redis is back.
func TestRedisDownClosedHoldsThenDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	proxy := testenv.NewProxy(t, e.redisAddr)
	e.seedAccount(5, "100.00")
	const n = 5
	msgs := e.seedOrders("RD%d", 5, n)
	c := e.start(proxy.Addr(), e.dsn)
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	proxy.Down()
	e.publish(msgs...)
	// Paused, holding the messages: none returned to the queue (on a quorum
	// queue each return would count toward its delivery limit).
	testenv.Eventually(t, 15*time.Second, func() bool {
		return !c.Ready() && testenv.Held(t, e.amqpURL, listener.MainQueue) == n && e.depth(listener.MainQueue) == 0
	}, "consumer did not pause holding all %d messages", n)
	if r := e.results(); len(r) != 0 {
		t.Fatalf("outcomes while Redis was down: %v; want none (held)", r)
	}
	if e.totalFlows() != 0 {
		t.Fatal("payments applied without the Redis guard under CLOSED")
	}
	// The dashboard's pause panel: the messages in workers' hands, counted
	// on Redis (the others are prefetched, not yet in a worker's hands).
	if held := testutil.ToFloat64(e.metrics.Held.WithLabelValues("redis")); held < 1 || held > n {
		t.Fatalf("paysvc_held_messages{dependency=\"redis\"} = %v, want 1 to %d", held, n)
	}
	if held := testutil.ToFloat64(e.metrics.Held.WithLabelValues("mysql")); held != 0 {
		t.Fatalf("paysvc_held_messages{dependency=\"mysql\"} = %v during a Redis outage", held)
	}
	proxy.Up()
	e.waitResults(20*time.Second, func(r map[string]int) bool { return r["FIRST"] == n }, "messages did not drain after Redis came back")
	if e.balance(5) != 10000-n*100 || e.totalFlows() != n {
		t.Fatalf("balance %s, %d flows", e.balance(5), e.totalFlows())
	}
	if held := testutil.ToFloat64(e.metrics.Held.WithLabelValues("redis")); held != 0 {
		t.Fatalf("paysvc_held_messages{dependency=\"redis\"} = %v after the drain, want 0", held)
	}
}

// Redis down under OPEN: the database guards alone apply the payment, once.
func TestRedisDownOpenGoesOnWithDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	proxy := testenv.NewProxy(t, e.redisAddr)
	proxy.Down()
	e.seedAccount(6, "100.00")
	e.seedOrder("OPEN1", 6, "1.00")
	msg := body("OPEN1", 6, "1.00")
	e.publish(msg, msg)
	e.start(proxy.Addr(), e.dsn, func(c *setup) { c.RedisFallback = listener.FallbackOpen })
	e.waitResults(15*time.Second, func(r map[string]int) bool { return r["FIRST"] == 1 && r["DUPLICATE"] == 1 },
		"not applied once with a duplicate")
	if e.flows("OPEN1") != 1 || e.balance(6) != 9900 {
		t.Fatal("payment not applied exactly once")
	}
	if e.logs.FilterMessageSnippet("database guards alone").Len() == 0 {
		t.Fatal("the degrade decision was not logged")
	}
}

// MySQL down: messages are requeued without spending attempts, consumption
// pauses, and everything drains when MySQL is back.
func TestMySQLDownPausesThenDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	proxy := testenv.NewProxy(t, "127.0.0.1:3306")
	dsn := strings.Replace(e.dsn, "127.0.0.1:3306", proxy.Addr(), 1)
	if dsn == e.dsn {
		t.Fatal("this test puts a proxy before 127.0.0.1:3306; PAYSVC_TEST_MYSQL_DSN points elsewhere")
	}
	e.seedAccount(9, "100.00")
	const n = 4
	msgs := e.seedOrders("MD%d", 9, n)
	c := e.start(e.redisAddr, dsn)
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	proxy.Down()
	e.publish(msgs...)
	testenv.Eventually(t, 20*time.Second, func() bool {
		return !c.Ready() && testenv.Held(t, e.amqpURL, listener.MainQueue) == n && e.depth(listener.MainQueue) == 0
	}, "consumer did not pause holding the messages")
	if r := e.results(); len(r) != 0 {
		t.Fatalf("outcomes while MySQL was down: %v; want none (held)", r)
	}
	proxy.Up()
	e.waitResults(30*time.Second, func(r map[string]int) bool { return r["FIRST"] == n }, "messages did not drain after MySQL came back")
	if e.totalFlows() != n || e.balance(9) != 10000-n*100 {
		t.Fatal("payments not applied exactly once")
	}
}

// A topology that exists with other arguments stops start-up with a clear
// error naming the queue.
func TestTopologyMismatchIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch := e.channel()
	if _, err := ch.QueueDeclare(listener.WaitQueue(e.delays[0]), true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	c := e.start(e.redisAddr, e.dsn)
	err := c.wait(t)
	if err == nil || !strings.Contains(err.Error(), "q.pay.dlx.wait.200ms exists with other arguments") {
		t.Fatalf("Run = %v, want a topology mismatch naming the queue", err)
	}
}

func TestDeclareIsIdempotentAndQuorum(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.declare()
	// A quorum queue refuses to be redeclared as classic: proof of its type.
	ch := e.channel()
	_, err := ch.QueueDeclare(listener.WaitQueue(e.delays[1]), true, false, false, false, amqp.Table{
		"x-queue-type":              "classic",
		"x-message-ttl":             int64(300),
		"x-dead-letter-exchange":    listener.RetryExchange,
		"x-dead-letter-routing-key": listener.MainQueue,
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish",
	})
	if err == nil || !strings.Contains(err.Error(), "x-queue-type") {
		t.Fatalf("redeclare as classic: %v, want inequivalent x-queue-type", err)
	}
}

// A retry copy that the broker cannot route (its wait queue was deleted) comes
// back through mandatory: the original is requeued, the session redeclares
// the topology, and the message still walks to terminal. Nothing is lost.
func TestUnroutableRetryCopyIsRequeuedNotLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(12, "1.00")
	e.seedOrder("UNR1", 12, "5.00")
	c := e.start(e.redisAddr, e.dsn)
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	ch := e.channel()
	if _, err := ch.QueueDelete(listener.WaitQueue(e.delays[0]), false, false, false); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	e.publish(body("UNR1", 12, "5.00"))
	e.waitResults(20*time.Second, func(r map[string]int) bool { return r["TERMINAL"] == 1 }, "never reached terminal")
	failed := e.logs.FilterMessageSnippet("copy not published").All()
	if len(failed) == 0 || !strings.Contains(fmt.Sprint(failed[0].ContextMap()["error"]), "unroutable") {
		t.Fatalf("no unroutable publish was detected: %v", failed)
	}
	if r := e.results(); r["REQUEUE"] == 0 || r["RETRY"] != 3 {
		t.Fatalf("outcomes %v, want a REQUEUE, then 3 RETRY", r)
	}
	if got := e.getAll(listener.TerminalQueue); len(got) != 1 {
		t.Fatalf("%d terminal messages, want 1", len(got))
	}
}

// The broker closes the connection (mid-stream if it is still busy): the
// consumer reconnects, redeclares and resumes; every payment, from before and
// after the cut, is applied exactly once.
func TestBrokerConnectionLossResumes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	const before, after = 300, 50
	e.seedAccount(13, "1000.00")
	msgs := e.seedOrders("BC%03d", 13, before+after)
	e.publish(msgs[:before]...)
	c := e.start(e.redisAddr, e.dsn, func(c *setup) { c.Workers, c.Prefetch = 2, 4 })
	e.waitResults(20*time.Second, func(r map[string]int) bool { return r["FIRST"] >= 10 }, "no progress")
	testenv.CloseConnections(t, e.amqpURL)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return e.logs.FilterMessage("amqp session ended; reconnecting").Len() > 0
	}, "the connection cut went unnoticed")
	e.publish(msgs[before:]...)
	// Count flows, not FIRST lines: a payment committed just before the cut
	// logs "outcome not acknowledged", and its redelivery is a DUPLICATE.
	testenv.Eventually(t, 60*time.Second, func() bool { return e.totalFlows() == before+after },
		"not every payment applied after the reconnect")
	if e.totalFlows() != before+after || e.balance(13) != 100000-(before+after)*100 {
		t.Fatalf("%d flows, balance %s", e.totalFlows(), e.balance(13))
	}
	testenv.Eventually(t, 10*time.Second, c.Ready, "not consuming after the reconnect")
}

// A connection cut in the middle of the login reads, in amqp091, as a
// refused login. At start-up paysvc tries again instead of stopping: a
// broker whose network blinked while paysvc started must not stop it.
func TestLoginCutAtStartUpIsRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p, proxied := testenv.AMQPProxy(t, e.amqpURL)
	var cuts atomic.Int32
	p.CutWhen(func(b []byte) bool { return testenv.IsAMQPStartOk(b) && cuts.Add(1) <= 2 })
	c := e.start(e.redisAddr, e.dsn, func(s *setup) { s.URL = proxied })
	testenv.Eventually(t, 20*time.Second, c.Ready, "not consuming after two logins were cut")
	if n := cuts.Load(); n < 3 {
		t.Fatalf("%d logins seen, want the two cut and one through", n)
	}
}

// A wrong password stops start-up, naming the setting, once it has been
// refused on every try.
func TestWrongPasswordStopsStartUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	u, err := url.Parse(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "not-the-password")
	c := e.start(e.redisAddr, e.dsn, func(s *setup) { s.URL = u.String() })
	err = c.wait(t)
	if err == nil || !strings.Contains(err.Error(), "amqp.url") || !strings.Contains(err.Error(), "3 times") {
		t.Fatalf("Run = %v, want a refused login naming amqp.url, after 3 tries", err)
	}
}

// The broker refuses (nacks) the terminal copy (an operator's policy caps
// the terminal queue, reject-publish): the original is held and the copy
// tried again with backoff, never acked and dropped, while the other
// payments are paid and the session goes on. When the session ends (here
// the consumer stops) it goes back to the queue. Sending the original
// straight back and restarting the session at each refusal would go on, on
// RabbitMQ 4.3+ where such a return spends no delivery, for ever.
func TestNackedTerminalCopyKeepsTheOriginal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	testenv.SetPolicy(t, e.amqpURL, "cap", `^q\.pay\.dlx\.terminal$`, `{"max-length":0,"overflow":"reject-publish"}`)
	if !testenv.Nacked(t, e.amqpURL, listener.TerminalQueue, []byte("filler"), 15*time.Second) {
		t.Fatal("the broker never refused a publish to the capped terminal queue")
	}
	e.seedAccount(10, "100.00")
	bodies := append([][]byte{[]byte(`not json`)}, e.seedOrders("CAP%02d", 10, 10)...) // a terminal copy, first
	e.publish(bodies...)
	c := e.start(e.redisAddr, e.dsn)
	testenv.Eventually(t, 15*time.Second, func() bool {
		refused := e.logs.FilterMessage("copy refused by the broker; holding the message and trying again").All()
		return len(refused) >= 2 && strings.Contains(fmt.Sprint(refused[0].ContextMap()["error"]), "nacked") &&
			testutil.ToFloat64(e.metrics.Held.WithLabelValues("broker")) == 1
	}, "the refused copy was not held and tried again")
	e.waitResults(15*time.Second, func(r map[string]int) bool { return r["FIRST"] == 10 }, "the other payments were not paid meanwhile")
	if n := testutil.ToFloat64(e.metrics.Reconnects.WithLabelValues("consumer")); n != 0 || e.results()["REQUEUE"] != 0 {
		t.Fatalf("%v consumer sessions restarted, outcomes %v: want none, nothing sent back while held", n, e.results())
	}
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	if r := e.results(); r["TERMINAL"] != 0 || r["REQUEUE"] != 1 {
		t.Fatalf("outcomes %v: want the original sent back once at the stop, never counted as terminal", r)
	}
	// The nack is asynchronous: the broker may take a moment to requeue.
	testenv.Eventually(t, 10*time.Second, func() bool { return e.depth(listener.MainQueue) == 1 },
		"%d messages in the main queue, want the original back", e.depth(listener.MainQueue))
}

// Redis lost the key (flush, eviction, failover) after the payment: the
// redelivery passes the Redis guard as new, and the database refuses it.
func TestRedisKeyLostDatabaseStillRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(14, "50.00")
	e.seedOrder("LOST1", 14, "5.00")
	msg := body("LOST1", 14, "5.00")
	e.publish(msg)
	e.start(e.redisAddr, e.dsn)
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["FIRST"] == 1 }, "not applied")
	e.rdb.Del(context.Background(), e.prefix+"LOST1")
	e.publish(msg)
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["DUPLICATE"] == 1 }, "redelivery not a duplicate")
	if e.flows("LOST1") != 1 || e.balance(14) != 4500 {
		t.Fatal("charged twice after Redis lost the key")
	}
	if n := testutil.ToFloat64(e.metrics.Disagreements.WithLabelValues("redis_new_db_applied")); n != 1 {
		t.Fatalf("disagreement metric %v, want 1", n)
	}
	if n := testutil.ToFloat64(e.metrics.Messages.WithLabelValues("DUPLICATE")); n != 1 {
		t.Fatalf("DUPLICATE counter %v, want 1", n)
	}
}

// amqp.queueType=quorum: the consumer works on a quorum main queue, and a
// message delivered more than the delivery limit goes to the terminal queue
// instead of going round for ever (a message that crashes every consumer).
func TestQuorumMainQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch := e.channel()
	if err := listener.DeclareTopology(ch, listener.Topology{Delays: e.delays, MainQueueType: "quorum", DeliveryLimit: 2}); err != nil {
		t.Fatal(err)
	}
	e.publish([]byte("crashes every consumer"))
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(listener.MainQueue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	deliveries := 0
	testenv.Eventually(t, 20*time.Second, func() bool {
		select {
		case d := <-ds:
			deliveries++
			d.Nack(false, true) // as a consumer that dies holding it
		default:
		}
		return e.depth(listener.TerminalQueue) == 1
	}, "the delivery limit did not dead-letter the message")
	ch.Close()
	got := e.getAll(listener.TerminalQueue)
	if len(got) != 1 || !strings.Contains(fmt.Sprint(got[0].Headers["x-death"]), "delivery_limit") || deliveries < 2 {
		t.Fatalf("%d deliveries; terminal %v", deliveries, got)
	}

	e.seedAccount(15, "10.00")
	e.seedOrder("QQ1", 15, "1.00")
	e.publish(body("QQ1", 15, "1.00"), body("QQ1", 15, "1.00"))
	e.start(e.redisAddr, e.dsn, func(c *setup) { c.MainQueueType, c.DeliveryLimit = "quorum", 2 })
	e.waitResults(15*time.Second, func(r map[string]int) bool { return r["FIRST"] == 1 && r["DUPLICATE"] == 1 }, "not applied once")
	if e.flows("QQ1") != 1 {
		t.Fatal("charged other than once")
	}
}

// One message whose handling times out while every dependency answers (its
// order row is locked past the handling timeout) goes back to the main
// queue alone, a bounded number of times, then spends an attempt; the
// other messages flow meanwhile and the consumer never pauses.
func TestOneSlowMessageDoesNotPauseTheOthers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(41, "100.00")
	e.seedOrder("SLOW1", 41, "1.00")
	var others [][]byte
	for i := range 20 {
		no := fmt.Sprintf("FAST%d", i)
		e.seedAccount(int64(500+i), "10.00")
		e.seedOrder(no, int64(500+i), "1.00")
		others = append(others, body(no, int64(500+i), "1.00"))
	}
	holder := e.db.MustBegin()
	defer holder.Rollback()
	holder.MustExec("SELECT status FROM t_order WHERE order_no = 'SLOW1' FOR UPDATE")

	c := e.start(e.redisAddr, e.dsn, func(cfg *setup) {
		cfg.HandleTimeout = time.Second // below the pool's lock wait (5s): the handling times out
		cfg.GroupSize = 1
		cfg.Retry.MaxAttempts = 5
	})
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer not ready")
	var paused atomic.Bool
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(5 * time.Millisecond):
				if !c.Ready() {
					paused.Store(true)
				}
			}
		}
	}()
	e.publish(append([][]byte{body("SLOW1", 41, "1.00")}, others...)...)

	slow := func(result string) int {
		n := 0
		for _, entry := range e.logs.FilterMessage("message handled").All() {
			m := entry.ContextMap()
			if m["order_no"] == "SLOW1" && m["result"] == result {
				n++
			}
		}
		return n
	}
	e.waitResults(20*time.Second, func(r map[string]int) bool { return r["FIRST"] == 20 }, "the other payments did not flow")
	testenv.Eventually(t, 20*time.Second, func() bool { return slow("RETRY") >= 1 }, "the slow message never spent an attempt")
	if n := slow("REQUEUE"); n < 3 {
		t.Fatalf("the slow message was requeued alone %d times before its retry, want 3", n)
	}
	holder.Rollback()
	testenv.Eventually(t, 20*time.Second, func() bool { return e.status("SLOW1") == order.Paid }, "the slow payment was not applied after the lock went")
	close(stopWatch)
	<-watched
	if paused.Load() || len(e.logs.FilterMessage("consumption paused; waiting for the dependency").All()) > 0 {
		t.Fatal("the consumer paused for one slow message")
	}
	if e.flows("SLOW1") != 1 || e.totalFlows() != 21 {
		t.Fatalf("flows: SLOW1 %d, total %d; want 1 and 21", e.flows("SLOW1"), e.totalFlows())
	}
	if got := testutil.ToFloat64(e.metrics.RequeuedAlone); got < 3 {
		t.Fatalf("paysvc_requeued_alone_total %v, want at least 3", got)
	}
}

// With FIRST sampled (log.firstPerSecond), applied payments' lines thin
// out while every other outcome is logged in full.
func TestSampledFirstKeepsOtherOutcomes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(71, "100.00")
	msgs := e.seedOrders("SMP%02d", 71, 30)
	e.start(e.redisAddr, e.dsn, func(cfg *setup) { cfg.FirstLog = logging.Sampled(e.log, 2, 1000) })
	e.publish(msgs...)
	testenv.Eventually(t, 20*time.Second, func() bool { return e.totalFlows() == 30 }, "payments not applied")
	e.publish(msgs...) // every one again: duplicates
	e.waitResults(20*time.Second, func(r map[string]int) bool { return r["DUPLICATE"] == 30 }, "duplicates not all logged")
	if r := e.results(); r["FIRST"] < 1 || r["FIRST"] > 10 {
		t.Fatalf("%d FIRST lines for 30 payments with 2 a second, want a sample", r["FIRST"])
	}
}

// COMMIT reaches the server and commits, and its reply is lost: the message
// goes back to the main queue alone without spending an attempt, the others
// flow, and the redelivery finds the payment applied by this message's own
// COMMIT (its notice carries the message's trace): it is acked and counted
// FIRST, once, as the payment it is, not a DUPLICATE; one flow.
func TestCommitUnknownIsRequeuedAloneThenCountedFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(81, "10.00")
	e.seedOrder("CUK1", 81, "1.00")
	proxy, proxied := testenv.MySQLProxy(t, e.dsn)
	var once atomic.Bool
	proxy.BlackholeAfter(func(b []byte) bool { return testenv.IsCommit(b) && once.CompareAndSwap(false, true) })
	e.start(e.redisAddr, proxied, func(c *setup) { c.HandleTimeout = 2 * time.Second })
	e.publish(body("CUK1", 81, "1.00"))
	e.waitResults(20*time.Second, func(r map[string]int) bool { return r["FIRST"]+r["DUPLICATE"] == 1 }, "the redelivery was not acked")
	var requeued, first map[string]any
	for _, entry := range e.logs.FilterMessage("message handled").All() {
		m := entry.ContextMap()
		switch m["result"] {
		case "REQUEUE":
			requeued = m
		case "FIRST":
			first = m
		}
	}
	if first == nil || first["commit_resolved"] != true || first["attempt"] != int64(0) {
		t.Fatalf("the redelivery's outcome %v: want FIRST, commit_resolved, no attempt spent; outcomes %v", first, e.results())
	}
	if got := testutil.ToFloat64(e.metrics.Messages.WithLabelValues("FIRST")); got != 1 {
		t.Fatalf("paysvc_messages_total{result=\"FIRST\"} = %v, want 1", got)
	}
	if requeued == nil || requeued["error_class"] != "commit_unknown" || requeued["attempt"] != int64(0) {
		t.Fatalf("first outcome %v: want REQUEUE, commit_unknown, no attempt spent", requeued)
	}
	if r := e.results(); r["DUPLICATE"] != 0 || r["RETRY"] != 0 || r["TERMINAL"] != 0 {
		t.Fatalf("outcomes %v", r)
	}
	if e.flows("CUK1") != 1 || e.balance(81) != 900 || e.status("CUK1") != order.Paid {
		t.Fatalf("flows %d, balance %s, status %s: want one payment", e.flows("CUK1"), e.balance(81), e.status("CUK1"))
	}
	if len(e.logs.FilterMessage("consumption paused; waiting for the dependency").All()) > 0 {
		t.Fatal("the consumer paused for one lost COMMIT reply")
	}
}
