package testenv

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/scratch"
)

// Channel opens a connection to url and a channel on it, closed at
// cleanup.
func Channel(t testing.TB, url string) *amqp.Channel {
	t.Helper()
	conn, ch := dial(t, url)
	t.Cleanup(func() { conn.Close() })
	return ch
}

func dial(t testing.TB, url string) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("rabbitmq unreachable (start it: scripts/ensure-services.sh): %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn, ch
}

// Publish sends bodies to queue through the default exchange, persistent and
// mandatory, and waits for each confirm. A nacked publish is sent again a
// few times, as a producer would: a quorum queue just declared nacks until
// its leader is elected.
func Publish(t testing.TB, url, queue string, bodies ...[]byte) {
	t.Helper()
	conn, ch := dial(t, url)
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, len(bodies)))
	for _, b := range bodies {
		for attempt := 1; ; attempt++ {
			conf, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
				ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b,
			})
			if err != nil {
				t.Fatal(err)
			}
			if conf.Wait() {
				break
			}
			if attempt == 10 {
				t.Fatal("publish nacked 10 times")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if len(returns) > 0 {
		t.Fatalf("%d messages unroutable to %s", len(returns), queue)
	}
}

// Depth is the number of ready messages in queue.
func Depth(t testing.TB, url, queue string) int {
	t.Helper()
	conn, ch := dial(t, url)
	defer conn.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	return q.Messages
}

// GetAll takes (and acks) every ready message of queue.
func GetAll(t testing.TB, url, queue string) []amqp.Delivery {
	t.Helper()
	conn, ch := dial(t, url)
	defer conn.Close()
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// Declare declares paysvc's topology with the given wait-queue delays.
func Declare(t testing.TB, url string, declare func(*amqp.Channel) error) {
	t.Helper()
	conn, ch := dial(t, url)
	defer conn.Close()
	if err := declare(ch); err != nil {
		t.Fatal(err)
	}
}

// QueueExists reports whether queue exists.
func QueueExists(t testing.TB, url, queue string) bool {
	t.Helper()
	conn, ch := dial(t, url)
	defer conn.Close()
	_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return err == nil
}

// CloseConnections makes the broker close every client connection of the
// URL's vhost, as a broker restart or a network cut would.
func CloseConnections(t testing.TB, amqpURL string) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	rabbitmqctl(t, "close_all_connections", "-p", strings.TrimPrefix(u.Path, "/"), "test: connection cut")
}

// SetPolicy sets a broker policy in the URL's vhost (rabbitmqctl set_policy).
func SetPolicy(t testing.TB, amqpURL, name, pattern, definition string) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	rabbitmqctl(t, "set_policy", "-p", strings.TrimPrefix(u.Path, "/"), "--apply-to", "queues", name, pattern, definition)
}

// ClearPolicy removes a policy SetPolicy set.
func ClearPolicy(t testing.TB, amqpURL, name string) {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	rabbitmqctl(t, "clear_policy", "-p", strings.TrimPrefix(u.Path, "/"), name)
}

// Nacked publishes body to queue until the broker nacks one, and reports
// whether it did before the deadline.
func Nacked(t testing.TB, amqpURL, queue string, body []byte, within time.Duration) bool {
	t.Helper()
	conn, ch := dial(t, amqpURL)
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(within); time.Now().Before(deadline); {
		conf, err := ch.PublishWithDeferredConfirm("", queue, false, false, amqp.Publishing{Body: body, DeliveryMode: amqp.Persistent})
		if err != nil {
			t.Fatal(err)
		}
		if !conf.Wait() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// Unacked returns, for each consumer of the URL's vhost, the messages it
// holds unacknowledged, by consumer tag (rabbitmqctl list_consumers and
// list_channels): a test can show a process held work when it was killed.
func Unacked(t testing.TB, amqpURL string) map[string]int {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	vhost := strings.TrimPrefix(u.Path, "/")
	consumers, err := scratch.RabbitmqCtlOutput("list_consumers", "-p", vhost, "channel_pid", "consumer_tag")
	if err != nil {
		t.Fatal(err)
	}
	channels, err := scratch.RabbitmqCtlOutput("list_channels", "-p", vhost, "pid", "messages_unacknowledged")
	if err != nil {
		t.Fatal(err)
	}
	unacked := map[string]int{}
	for _, line := range strings.Split(channels, "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			n, _ := strconv.Atoi(f[1])
			unacked[f[0]] = n
		}
	}
	out := map[string]int{}
	for _, line := range strings.Split(consumers, "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			out[f[1]] = unacked[f[0]]
		}
	}
	return out
}

// Held returns the messages of queue delivered to a consumer and not yet
// acknowledged (rabbitmqctl list_queues messages_unacknowledged).
func Held(t testing.TB, amqpURL, queue string) int {
	t.Helper()
	return listQueue(t, amqpURL, queue, "messages_unacknowledged")
}

// Total returns every message queue holds (rabbitmqctl list_queues
// messages): ready, unacknowledged, and those a quorum queue keeps while its
// dead-letter worker has not delivered them, which queue.declare (Depth)
// does not count.
func Total(t testing.TB, amqpURL, queue string) int {
	t.Helper()
	return listQueue(t, amqpURL, queue, "messages")
}

// listQueue reads one numeric column of queue from rabbitmqctl list_queues.
func listQueue(t testing.TB, amqpURL, queue, column string) int {
	t.Helper()
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	out, err := scratch.RabbitmqCtlOutput("list_queues", "-p", strings.TrimPrefix(u.Path, "/"), "name", column)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}
