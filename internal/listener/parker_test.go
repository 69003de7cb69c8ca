package listener_test

import (
	"context"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// startParker runs a Parker on the env's vhost and store until the test ends.
func (e *env) startParker(store *deadletter.Store, timeout time.Duration) (stop func() time.Duration) {
	e.t.Helper()
	p := &listener.Parker{URL: e.amqpURL, Name: e.t.Name(), Store: store, Log: e.log, Metrics: e.metrics, Timeout: timeout,
		ConsumerTimeout: 90 * time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	stop = func() time.Duration {
		start := time.Now()
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			e.t.Error("the parker did not stop within 30s")
		}
		return time.Since(start)
	}
	e.t.Cleanup(func() { stop() })
	return stop
}

func (e *env) deadLetters(query string, args ...any) []deadletter.DeadLetter {
	e.t.Helper()
	var ids []int64
	if err := e.db.Select(&ids, "SELECT id FROM t_dead_letter WHERE "+query+" ORDER BY id", args...); err != nil {
		e.t.Fatal(err)
	}
	var out []deadletter.DeadLetter
	for _, id := range ids {
		d, _, err := deadletter.NewStore(e.db).Get(context.Background(), id)
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// A message paysvc sent through a retry, which the broker then
// dead-lettered by itself (here: rejected from the main queue), is parked
// with the broker's reason, not the stale class of the earlier retry.
func TestParkedReasonIsWhatFinallyHappened(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(31, "1.00")
	e.seedOrder("STALE1", 31, "5.00")
	c := e.start(e.redisAddr, e.dsn)
	e.publish(body("STALE1", 31, "5.00"))
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["RETRY"] >= 1 }, "the payment was not retried")
	if err := c.stop(); err != nil {
		t.Fatal(err)
	}
	// The copy comes back from its wait queue; take it and reject it.
	var d amqp.Delivery
	testenv.Eventually(t, 10*time.Second, func() bool {
		var ok bool
		var err error
		d, ok, err = e.ch.Get(listener.MainQueue, false)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}, "the retried copy never came back to the main queue")
	if d.Headers[listener.HeaderErrorClass] != "balance_not_enough" {
		t.Fatalf("the retried copy says %v", d.Headers[listener.HeaderErrorClass])
	}
	if err := d.Reject(false); err != nil {
		t.Fatal(err)
	}
	e.startParker(deadletter.NewStore(e.db), 0)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters("order_no = 'STALE1'")) == 1 }, "not parked")
	got := e.deadLetters("order_no = 'STALE1'")[0]
	if got.ErrorClass != "dead_lettered" || !strings.Contains(got.LastError, "rejected from q.pay.success") ||
		!strings.Contains(got.LastError, "before that, paysvc: balance_not_enough") {
		t.Fatalf("parked as %s: %s; want the broker's rejection, then the earlier class", got.ErrorClass, got.LastError)
	}

	// paysvc's own terminal copy keeps paysvc's reason, even with the
	// x-death of the wait queue it came back from.
	e.seedOrder("STALE2", 31, "7.00")
	e.publish(body("STALE2", 31, "7.00"))
	e.start(e.redisAddr, e.dsn, func(cfg *setup) { cfg.Retry.MaxAttempts = 1 })
	testenv.Eventually(t, 10*time.Second, func() bool { return len(e.deadLetters("order_no = 'STALE2'")) == 1 }, "not parked")
	got = e.deadLetters("order_no = 'STALE2'")[0]
	if got.ErrorClass != "balance_not_enough" || !strings.Contains(got.LastError, "gave up after 1 retries") {
		t.Fatalf("paysvc's terminal copy parked as %s: %s", got.ErrorClass, got.LastError)
	}
}

// Headers too large for their column (error 1406 in strict mode) are cut
// to fit and said so; a message the table refuses even so is parked with its
// body alone; neither stops the messages behind it.
func TestParkerStoresWhatFitsAndGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	// A CHECK the table refuses any row of this class with: the fallback's case.
	e.db.MustExec("ALTER TABLE t_dead_letter ADD CONSTRAINT ck_test_refuse CHECK (error_class <> 'refused_by_test')")
	conn, ch := e.conn, e.channel()
	_ = conn
	for _, m := range []amqp.Publishing{
		{Headers: amqp.Table{"big": strings.Repeat("h", 70000), listener.HeaderErrorClass: "bad_message",
			listener.HeaderLastError: "bad \xff\xfe bytes", listener.HeaderRoutedTo: listener.TerminalQueue},
			Body: []byte(`{"orderNo":"BIG1","userId":1,"amount":"1.00"}`)},
		{Headers: amqp.Table{listener.HeaderErrorClass: "refused_by_test", listener.HeaderRoutedTo: listener.TerminalQueue},
			Body: []byte(`{"orderNo":"REF1","userId":1,"amount":"1.00"}`)},
		{Headers: amqp.Table{listener.HeaderErrorClass: "mismatch", listener.HeaderLastError: "after",
			listener.HeaderRoutedTo: listener.TerminalQueue}, Body: []byte(`{"orderNo":"AFTER1","userId":1,"amount":"1.00"}`)},
	} {
		m.DeliveryMode = amqp.Persistent
		if err := ch.PublishWithContext(context.Background(), "", listener.TerminalQueue, true, false, m); err != nil {
			t.Fatal(err)
		}
	}
	e.startParker(deadletter.NewStore(e.db), 0)
	testenv.Eventually(t, 15*time.Second, func() bool { return len(e.deadLetters("1 = 1")) == 3 }, "not every message parked")
	big := e.deadLetters("order_no = 'BIG1'")[0]
	if !strings.Contains(big.LastError, "headers cut from") || len(big.Headers) > 65535 || !strings.Contains(big.LastError, "bad ? bytes") {
		t.Fatalf("oversized headers parked as %q (%d bytes of headers)", big.LastError, len(big.Headers))
	}
	refused := e.deadLetters("body LIKE '%REF1%'")
	if len(refused) != 1 || refused[0].ErrorClass != listener.ClassUnparkable || !strings.Contains(refused[0].LastError, "refused_by_test") ||
		string(refused[0].Body) != `{"orderNo":"REF1","userId":1,"amount":"1.00"}` {
		t.Fatalf("the refused message: %+v", refused)
	}
	if testenv.Depth(t, e.amqpURL, listener.TerminalQueue) != 0 {
		t.Fatal("messages left in the terminal queue")
	}
}

// A black-holed MySQL holds neither the parker nor its shutdown: every
// write has a deadline, and the message waits in the queue.
func TestParkerWithBlackholedMySQL(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	proxy, proxied := testenv.MySQLProxy(t, e.dsn)
	db, err := sqldb.Open(context.Background(), proxied, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	proxy.BlackholeWhen(func([]byte) bool { return true }) // everything from now on
	stop := e.startParker(deadletter.NewStore(db), time.Second)
	testenv.Publish(t, e.amqpURL, listener.TerminalQueue, []byte(`{"orderNo":"BH1","userId":1,"amount":"1.00"}`))
	testenv.Eventually(t, 10*time.Second, func() bool {
		return len(e.logs.FilterMessage("parker: cannot park; holding the message and trying again").All()) > 0
	}, "the parker never gave up on the black-holed write")
	if took := stop(); took > 5*time.Second {
		t.Fatalf("the parker took %s to stop", took)
	}
	// Back in the queue once the parker's channel is gone.
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Depth(t, e.amqpURL, listener.TerminalQueue) == 1 },
		"the message that could not be parked is not back in the terminal queue")
}

// The broker cancels one of the parker's consumers (its queue, the
// overflow queue, was deleted, then declared again): the parker starts a
// new session and parks what arrives there, instead of going on with its
// other consumer alone and leaving that queue unread until a restart.
func TestParkerConsumesAgainAfterTheBrokerCancelsAConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.startParker(deadletter.NewStore(e.db), 0)
	ch := e.channel()
	defer ch.Close()
	consumers := func() int {
		ch := e.channel()
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(listener.OverflowQueue, true, false, false, false, nil)
		if err != nil {
			return -1
		}
		return q.Consumers
	}
	testenv.Eventually(t, 15*time.Second, func() bool { return consumers() == 1 }, "the parker never consumed the overflow queue")
	if _, err := ch.QueueDelete(listener.OverflowQueue, false, false, false); err != nil {
		t.Fatal(err)
	}
	e.declare()
	err := ch.PublishWithContext(context.Background(), "", listener.OverflowQueue, true, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		Headers:      amqp.Table{listener.HeaderErrorClass: "mismatch", listener.HeaderRoutedTo: listener.TerminalQueue},
		Body:         []byte(`{"orderNo":"CANCEL1","userId":1,"amount":"1.00"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return len(e.deadLetters("order_no = 'CANCEL1'")) == 1 },
		"the message sent after the cancel was never parked")
}
