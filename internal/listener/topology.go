package listener

import (
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Topology names. Operators and other tools depend on them: keep them.
const (
	MainQueue     = "q.pay.success"
	DLXExchange   = "ex.pay.dlx"
	RetryExchange = "ex.pay.retry"
	TerminalQueue = "q.pay.dlx.terminal"
	waitPrefix    = "q.pay.dlx.wait."
)

// WaitQueue names the wait queue for a delay: q.pay.dlx.wait.30s, ...1m, ...5m.
func WaitQueue(d time.Duration) string { return waitPrefix + FormatDelay(d) }

// FormatDelay writes a delay the short way: 30s, 1m, 1m30s, 1h, 1500ms.
func FormatDelay(d time.Duration) string {
	if d%time.Second != 0 {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	s := d.String() // e.g. 1h0m0s, 5m0s, 1m30s
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Declare declares the whole topology, durable, and so checks that what
// already exists matches: RabbitMQ refuses a redeclaration with other
// arguments, which is reported naming the object and what to do.
//
//	q.pay.success          classic (or quorum with a delivery limit), dead-letters
//	                       to ex.pay.dlx → q.pay.dlx.terminal
//	ex.pay.dlx (direct)    → q.pay.dlx.wait.<delay>..., q.pay.dlx.terminal
//	q.pay.dlx.wait.<delay> quorum, TTL <delay>, at-least-once dead-lettering
//	                       through ex.pay.retry → q.pay.success
//	q.pay.dlx.terminal     quorum
func Declare(ch *amqp.Channel, delays []time.Duration) error {
	return DeclareTopology(ch, Topology{Delays: delays})
}

// Topology is what Declare needs to know.
type Topology struct {
	Delays []time.Duration
	// MainQueueType is "classic" (default) or "quorum". A quorum main queue
	// replicates across a cluster and dead-letters a message delivered more
	// than DeliveryLimit times to the terminal queue, at least once: a
	// message that crashes every consumer stops going round.
	MainQueueType string
	DeliveryLimit int
}

// DeclareTopology declares the topology; see Declare.
func DeclareTopology(ch *amqp.Channel, t Topology) error {
	delays := t.Delays
	exchanges := []string{DLXExchange, RetryExchange}
	for _, ex := range exchanges {
		if err := ch.ExchangeDeclare(ex, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
			return mismatch("exchange", ex, err)
		}
	}
	type queue struct {
		name, exchange string
		args           amqp.Table
	}
	mainArgs := amqp.Table{
		"x-dead-letter-exchange":    DLXExchange,
		"x-dead-letter-routing-key": TerminalQueue,
	}
	if t.MainQueueType == "quorum" {
		mainArgs["x-queue-type"] = "quorum"
		mainArgs["x-delivery-limit"] = int64(t.DeliveryLimit)
		mainArgs["x-dead-letter-strategy"] = "at-least-once"
		mainArgs["x-overflow"] = "reject-publish"
	}
	queues := []queue{{name: MainQueue, exchange: RetryExchange, args: mainArgs}}
	for _, d := range delays {
		queues = append(queues, queue{
			name: WaitQueue(d), exchange: DLXExchange,
			args: amqp.Table{
				"x-queue-type":              "quorum",
				"x-message-ttl":             d.Milliseconds(),
				"x-dead-letter-exchange":    RetryExchange,
				"x-dead-letter-routing-key": MainQueue,
				"x-dead-letter-strategy":    "at-least-once",
				"x-overflow":                "reject-publish",
			},
		})
	}
	queues = append(queues, queue{name: TerminalQueue, exchange: DLXExchange, args: terminalArgs})
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q.name, true, false, false, false, q.args); err != nil {
			return mismatch("queue", q.name, err)
		}
		if err := ch.QueueBind(q.name, q.name, q.exchange, false, nil); err != nil {
			return fmt.Errorf("topology: bind %s to %s: %w", q.name, q.exchange, err)
		}
	}
	return nil
}

var terminalArgs = amqp.Table{"x-queue-type": "quorum"}

func mismatch(kind, name string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		return fmt.Errorf("topology: %s %s exists with other arguments than paysvc declares; "+
			"drain and delete it, or restore the configuration it was made with: %w", kind, name, err)
	}
	return fmt.Errorf("topology: declare %s %s: %w", kind, name, err)
}
