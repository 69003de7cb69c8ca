package listener_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/zap"

	"github.com/paysvc/paysvc/internal/deadletter"
	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/metrics"
	"github.com/paysvc/paysvc/internal/outbox"
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
