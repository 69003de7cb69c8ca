package listener_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/listener"
	"github.com/paysvc/paysvc/internal/testenv"
)

// A resource alarm (here the memory watermark set to nothing, on a node of
// the test's own: alarms are node-wide) stops the broker reading every
// connection that publishes. A payment that needs a retry copy is held
// (paysvc_broker_blocked, paysvc_held_messages{dependency="broker"}) and
// its copy goes out once the alarm clears; the others are paid and acked
// meanwhile, because the copies go out on a connection of their own and
// the consumer's acks still flow. Were the copies published on the
// consumer's connection, the first one would block it: its acks would
// stall, and every publish timeout would restart the session and
// redeliver what was already paid.
func TestResourceAlarmHoldsCopiesAndAcksTheRest(t *testing.T) {
	t.Parallel()
	node, _, addr := testenv.RabbitNode(t, "", nil)
	e := newEnv(t)
	e.amqpURL = "amqp://guest:guest@" + addr + "/"
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.conn = conn
	e.ch = e.channel()
	e.declare()
	e.seedAccount(9, "100.00")
	bodies := append([][]byte{body("ALARM-NONE", 9, "1.00")}, e.seedOrders("ALARM%02d", 9, 20)...) // no such order: a retry copy, first
	e.publish(bodies...)

	clearAlarm := testenv.MemoryAlarm(t, node)

	e.start(e.redisAddr, e.dsn)
	blocked := func() float64 { return testutil.ToFloat64(e.metrics.BrokerBlocked.WithLabelValues("consumer")) }
	held := func() float64 { return testutil.ToFloat64(e.metrics.Held.WithLabelValues("broker")) }
	testenv.Eventually(t, 30*time.Second, func() bool { return blocked() == 1 && held() == 1 },
		"the copy was not held as blocked (paysvc_broker_blocked %v, held %v)", blocked(), held())
	// The 20 payable ones: paid and acked during the alarm, once each.
	testenv.Eventually(t, 30*time.Second, func() bool {
		return unackedAndReady(t, node) == "0 1"
	}, "the payable messages were not acked during the alarm (ready, unacked: %s)", unackedAndReady(t, node))
	for i := range 20 {
		if no := fmt.Sprintf("ALARM%02d", i); e.flows(no) != 1 {
			t.Fatalf("%s has %d flows", no, e.flows(no))
		}
	}
	if r := e.results(); r["FIRST"] != 20 || r["DUPLICATE"] != 0 || r["RETRY"] != 0 {
		t.Fatalf("outcomes during the alarm %v: want 20 FIRST, nothing redelivered, the copy held", r)
	}
	if n := testutil.ToFloat64(e.metrics.Reconnects.WithLabelValues("consumer")); n != 0 {
		t.Fatalf("%v consumer sessions restarted during the alarm, want 0", n)
	}

	clearAlarm()
	e.waitResults(30*time.Second, func(r map[string]int) bool { return r["RETRY"] >= 1 },
		"the held copy did not go out after the alarm")
	testenv.Eventually(t, 10*time.Second, func() bool { return blocked() == 0 && held() == 0 },
		"still reported blocked after the alarm (%v, held %v)", blocked(), held())
}

// unackedAndReady is the main queue's ready and unacknowledged message
// counts on node, "ready unacked".
func unackedAndReady(t *testing.T, node string) string {
	out := testenv.RabbitCtl(t, node, "list_queues", "--no-table-headers", "name", "messages_ready", "messages_unacknowledged")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == listener.MainQueue {
			return f[1] + " " + f[2]
		}
	}
	return "?"
}

// A copy whose channel the broker closes (here its exchange was deleted:
// 404) is not a refusal, although the client resolves a closing channel's
// confirms as nacks: the original goes back and a new session declares the
// topology again, and the copy then goes out. Held as a refusal, it would
// wait for ever.
func TestCopyOnAClosedChannelIsNotARefusal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.declare()
	e.seedAccount(11, "10.00")
	e.seedOrder("GONE1", 11, "1.00")
	e.start(e.redisAddr, e.dsn)
	e.publish(body("GONE1", 11, "1.00"))
	e.waitResults(10*time.Second, func(r map[string]int) bool { return r["FIRST"] == 1 }, "not consuming")
	if err := e.channel().ExchangeDelete(listener.DLXExchange, false, false); err != nil {
		t.Fatal(err)
	}
	e.publish(body("GONE-NONE", 11, "1.00")) // no such order: a retry copy to the deleted exchange
	e.waitResults(30*time.Second, func(r map[string]int) bool { return r["RETRY"] >= 1 },
		"the copy never went out once the topology was declared again")
	if n := len(e.logs.FilterMessage("copy refused by the broker; holding the message and trying again").All()); n != 0 {
		t.Fatalf("a closed channel was taken for a refusal %d times", n)
	}
}
