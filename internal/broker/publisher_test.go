package broker_test

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/testenv"
)

// basicPublish starts every basic.publish method frame's payload: class 60,
// method 40.
var basicPublish = []byte{0x00, 0x3c, 0x00, 0x28}

// A batch leaves for the broker in one write, not one per message: the
// broker is woken once for it. Every message is stored and confirmed.
func TestPublishBatchWritesTheBatchAtOnce(t *testing.T) {
	t.Parallel()
	good := testenv.AMQP(t)
	p, u := testenv.AMQPProxy(t, good)
	var chunks atomic.Int64 // reads by the proxy that carried a publish
	p.BlackholeAfter(func(toServer []byte) bool {
		if bytes.Contains(toServer, basicPublish) {
			chunks.Add(1)
		}
		return false
	})
	const queue, n = "batch", 100
	testenv.Declare(t, good, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		return err
	})
	conn, err := broker.Dial(u, t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pub := broker.NewPublisher(conn, 10*time.Second)
	defer pub.Close()
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprint("m", i), DeliveryMode: amqp.Persistent,
			Body: []byte(fmt.Sprintf(`{"order_no":"ORD%06d","amount":"1.00"}`, i))}
	}
	for i, err := range pub.PublishBatch(context.Background(), "", queue, msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if got := testenv.Depth(t, good, queue); got != n {
		t.Fatalf("queue holds %d messages, want %d", got, n)
	}
	// One write of about 10 KB; the proxy may read it in two.
	if got := chunks.Load(); got > 2 {
		t.Fatalf("the batch of %d reached the broker in %d reads, want 1 or 2: written one message at a time", n, got)
	}
	// Uncorked again: a single publish goes out at once and is confirmed.
	if err := pub.Publish(context.Background(), "", queue, msgs[0]); err != nil {
		t.Fatal(err)
	}
}

// A batch whose publishing stops half way reports every message unsent:
// the ones before the failure were never confirmed. (The outbox marks a
// notice SENT on a nil error: a nil here for an unconfirmed message would
// lose the notice if the broker never stored it.)
func TestPublishBatchFailingHalfWayConfirmsNothing(t *testing.T) {
	t.Parallel()
	u := testenv.AMQP(t)
	const queue = "batch"
	testenv.Declare(t, u, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
		return err
	})
	conn, err := broker.Dial(u, t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pub := broker.NewPublisher(conn, 10*time.Second)
	defer pub.Close()
	msgs := make([]amqp.Publishing, 10)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: fmt.Sprint("m", i), Body: []byte("{}")}
	}
	msgs[5].Headers = amqp.Table{"bad": struct{}{}} // amqp091 refuses to send it
	for i, err := range pub.PublishBatch(context.Background(), "", queue, msgs) {
		if err == nil {
			t.Errorf("message %d: nil error, but the batch stopped at message 5 before any confirm", i)
		}
	}
	// The publisher recovers: the next batch goes through.
	msgs[5].Headers = nil
	for i, err := range pub.PublishBatch(context.Background(), "", queue, msgs) {
		if err != nil {
			t.Fatalf("message %d of the next batch: %v", i, err)
		}
	}
}
