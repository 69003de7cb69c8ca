package listener

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/testenv"
)

// The deliveries of a cancelled consumer that no worker started go back to
// the queue with a nack while the channel is still open: on RabbitMQ 4.x
// the channel's close would count each toward the quorum queue's delivery
// limit, the nack does not. One acked delivery below them is not named
// again (the channel would close on an unknown tag).
func TestReturnUnstartedNacksWhatNoWorkerStarted(t *testing.T) {
	t.Parallel()
	url := testenv.AMQP(t)
	ch := testenv.Channel(t, url)
	const queue = "teardown"
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	const n = 10
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = []byte{byte('a' + i)}
	}
	testenv.Publish(t, url, queue, bodies...)
	if err := ch.Qos(n, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "teardown", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	take := func() amqp.Delivery {
		select {
		case d := <-deliveries:
			return d
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery within 10s")
			return amqp.Delivery{}
		}
	}
	acked, held := take(), take() // one a worker settled, one dispatch held
	if err := acked.Ack(false); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Held(t, url, queue) == n-1 },
		"the %d other deliveries were never prefetched", n-1)
	if err := ch.Cancel("teardown", false); err != nil {
		t.Fatal(err)
	}

	returned, err := returnUnstarted(ch, deliveries, held.DeliveryTag)
	if err != nil || returned != n-1 {
		t.Fatalf("returnUnstarted: %d returned, error %v; want %d, nil", returned, err, n-1)
	}
	// Back in the queue with the channel open: returned by the nack, not by
	// a close.
	testenv.Eventually(t, 10*time.Second, func() bool { return testenv.Depth(t, url, queue) == n-1 },
		"the unstarted deliveries are not back in the queue while the channel is open (ready %d, want %d)",
		testenv.Depth(t, url, queue), n-1)
	if _, err := ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatalf("the channel did not survive the nack: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	if d := testenv.Depth(t, url, queue); d != n-1 {
		t.Fatalf("%d messages in the queue after the close, want %d (the acked one gone)", d, n-1)
	}

	// Nothing taken, nothing held: no nack at all (a tag of 0 with
	// multiple=true would return every unsettled delivery).
	empty := make(chan amqp.Delivery)
	close(empty)
	if returned, err := returnUnstarted(ch, empty, 0); returned != 0 || err != nil {
		t.Fatalf("returnUnstarted with nothing to return: %d, %v", returned, err)
	}
}
