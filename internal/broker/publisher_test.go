package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/broker"
	"github.com/paysvc/paysvc/internal/testenv"
)

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
