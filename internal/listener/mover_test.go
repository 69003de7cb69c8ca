package listener_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/testenv"
)

// startMover runs a Mover over the env's wait queues until the test ends.
func (e *env) startMover() {
	e.t.Helper()
	m := &listener.Mover{URL: e.amqpURL, Name: e.t.Name(), Delays: e.delays, Log: e.log, Metrics: e.metrics,
		PublishTimeout: 5 * time.Second, ConsumerTimeout: 24 * time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			e.t.Error("the mover did not stop")
		}
	})
}

// A retry copy whose wait queue cannot dead-letter it (the broker's
// at-least-once dead-letter worker holds an expired copy it cannot
// deliver: here, its route taken away) stays in the queue, counted in its
// messages but neither ready nor unacked: without the mover the payment
// stays unpaid. The mover takes each copy when it arrives, holds it until
// due and publishes it to the main queue itself; the payment is applied
// once and the wait queue holds nothing at all.
func TestMoverBringsBackWhatTheDeadLetterWorkerStrands(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(51, "10.00")
	c := e.start(e.redisAddr, e.dsn)
	e.startMover()
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	// After the consumer's session declared (and bound) the topology.
	ch := e.channel()
	if err := ch.QueueUnbind(listener.MainQueue, listener.MainQueue, listener.RetryExchange, nil); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	e.publish(body("MOV1", 51, "1.00")) // the order comes later: order_not_found, a retry
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["RETRY"] >= 1 }, "no retry")
	e.seedOrder("MOV1", 51, "1.00")
	testenv.Eventually(t, 20*time.Second, func() bool { return e.flows("MOV1") == 1 }, "the retry copy never came back")
	if e.status("MOV1") != order.Paid || e.balance(51) != 900 {
		t.Fatalf("status %s, balance %s", e.status("MOV1"), e.balance(51))
	}
	for _, d := range e.delays {
		q := listener.WaitQueue(d)
		testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Total(t, e.amqpURL, q) == 0 },
			"%s still holds messages", q)
	}
	if moved := testutil.ToFloat64(e.metrics.RetryCopiesMoved); moved < 1 {
		t.Fatalf("paysvc_retry_copies_moved_total = %v", moved)
	}
	ledger := idem.New(e.rdb, idem.Config{KeyPrefix: e.prefix}).Retries()
	if copies, err := ledger.Of(context.Background(), "MOV1"); err != nil || len(copies) != 0 {
		t.Fatalf("the retry ledger still watches %v (%v) after the copy came back", copies, err)
	}
}

// A copy the broker strands is seen: the retry ledger holds it from its
// publish, overdue once its delay and a margin have passed, and names its
// queue and attempt.
func TestRetryLedgerShowsAStrandedCopy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(52, "10.00")
	c := e.start(e.redisAddr, e.dsn)
	testenv.Eventually(t, 10*time.Second, c.Ready, "consumer never ready")
	ch := e.channel()
	if err := ch.QueueUnbind(listener.MainQueue, listener.MainQueue, listener.RetryExchange, nil); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	e.publish(body("LDG1", 52, "1.00")) // no order: a retry, which the broker then strands
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["RETRY"] >= 1 }, "no retry")
	wait := listener.WaitQueue(e.delays[0])
	testenv.Eventually(t, 10*time.Second, func() bool {
		return testenv.Total(t, e.amqpURL, wait) == 1 && e.depth(wait) == 0
	}, "the copy is not stranded in %s (counted, not ready)", wait)
	ctx := context.Background()
	ledger := idem.New(e.rdb, idem.Config{KeyPrefix: e.prefix}).Retries()
	copies, err := ledger.Of(ctx, "LDG1")
	if err != nil || len(copies) != 1 || copies[0].Queue != wait || copies[0].Attempt != 1 {
		t.Fatalf("ledger entries %+v (%v), want the copy of attempt 1 in %s", copies, err, wait)
	}
	if n, err := ledger.Overdue(ctx, time.Now()); err != nil || n != 0 {
		t.Fatalf("%d overdue now (%v): the margin (a minute at least) has not passed", n, err)
	}
	if n, err := ledger.Overdue(ctx, time.Now().Add(2*time.Minute)); err != nil || n != 1 {
		t.Fatalf("%d overdue in two minutes (%v), want 1", n, err)
	}
	m := &listener.Monitor{URL: e.amqpURL, Name: t.Name(), Delays: e.delays, Store: deadletter.NewStore(e.db), DB: e.db,
		Metrics: e.metrics, Interval: time.Second, Log: e.log, Retries: futureLedger{ledger, 2 * time.Minute}}
	if err := m.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(e.metrics.RetryCopiesOverdue); got != 1 {
		t.Fatalf("paysvc_retry_copies_overdue = %v, want 1", got)
	}
}

// futureLedger reads the ledger as if it were later.
type futureLedger struct {
	*idem.Retries
	ahead time.Duration
}

func (f futureLedger) Overdue(ctx context.Context, now time.Time) (int64, error) {
	return f.Retries.Overdue(ctx, now.Add(f.ahead))
}
