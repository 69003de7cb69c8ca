package listener

import (
	"cmp"
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
	// OverflowQueue takes what the terminal queue dead-letters past its
	// delivery limit (the parker returned a message that often: repeated
	// broker connection losses while it held it). A classic queue: it has
	// no delivery limit, so nothing past it can vanish. The parker drains it
	// like the terminal queue.
	OverflowQueue = "q.pay.dlx.terminal.overflow"
	waitPrefix    = "q.pay.dlx.wait."
)

// DefaultDeliveryLimit is the x-delivery-limit of every quorum queue paysvc
// declares, the main queue's unless amqp.deliveryLimit says otherwise.
// RabbitMQ 4.x gives a quorum queue without one a limit of 20 and drops a
// message past it when the queue has no dead-letter target: every quorum
// queue here has both, explicitly.
const DefaultDeliveryLimit = 20

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

// Declare declares the whole topology, with a quorum main queue and the
// default limits, as paysvc does by default; see DeclareTopology.
func Declare(ch *amqp.Channel, delays []time.Duration) error {
	return DeclareTopology(ch, Topology{Delays: delays})
}

// Topology is what DeclareTopology needs to know.
type Topology struct {
	Delays []time.Duration
	// MainQueueType is "quorum" (the default, also for "") or "classic"
	// (one node, for development). A quorum main queue replicates across a
	// cluster and dead-letters a message delivered more than DeliveryLimit
	// times to the terminal queue, at least once: a message that crashes
	// every consumer stops going round.
	MainQueueType string
	DeliveryLimit int // main queue; 0: DefaultDeliveryLimit
	// TerminalDeliveryLimit bounds the terminal queue's deliveries before
	// a message moves to OverflowQueue; 0: DefaultDeliveryLimit.
	TerminalDeliveryLimit int
}

// quorum is the arguments of a quorum queue that dead-letters at least
// once to exchange/key, past limit deliveries too.
func quorum(limit int, exchange, key string) amqp.Table {
	return amqp.Table{
		"x-queue-type":              "quorum",
		"x-delivery-limit":          int64(limit),
		"x-dead-letter-exchange":    exchange,
		"x-dead-letter-routing-key": key,
		"x-dead-letter-strategy":    "at-least-once",
		"x-overflow":                "reject-publish", // at-least-once needs it
	}
}

// DeclareTopology declares the topology durable, and so checks that what
// already exists matches: RabbitMQ refuses a redeclaration with other
// arguments, which is reported naming the object and what to do.
//
//	q.pay.success          quorum (x-delivery-limit, or classic), dead-letters
//	                       to ex.pay.dlx → q.pay.dlx.terminal
//	ex.pay.dlx (direct)    → q.pay.dlx.wait.<delay>..., q.pay.dlx.terminal,
//	                       q.pay.dlx.terminal.overflow
//	q.pay.dlx.wait.<delay> quorum, TTL <delay>, dead-letters at least once
//	                       through ex.pay.retry → q.pay.success
//	q.pay.dlx.terminal     quorum, past its limit → q.pay.dlx.terminal.overflow
//	q.pay.dlx.terminal.overflow  classic
func DeclareTopology(ch *amqp.Channel, t Topology) error {
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
	mainArgs := quorum(cmp.Or(t.DeliveryLimit, DefaultDeliveryLimit), DLXExchange, TerminalQueue)
	if t.MainQueueType == "classic" {
		mainArgs = amqp.Table{"x-dead-letter-exchange": DLXExchange, "x-dead-letter-routing-key": TerminalQueue}
	}
	queues := []queue{{name: MainQueue, exchange: RetryExchange, args: mainArgs}}
	for _, d := range t.Delays {
		args := quorum(DefaultDeliveryLimit, RetryExchange, MainQueue)
		args["x-message-ttl"] = d.Milliseconds()
		queues = append(queues, queue{name: WaitQueue(d), exchange: DLXExchange, args: args})
	}
	queues = append(queues, queue{name: TerminalQueue, exchange: DLXExchange, args: terminalArgs(t.TerminalDeliveryLimit)},
		queue{name: OverflowQueue, exchange: DLXExchange, args: overflowArgs})
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

func terminalArgs(limit int) amqp.Table {
	return quorum(cmp.Or(limit, DefaultDeliveryLimit), DLXExchange, OverflowQueue)
}

var overflowArgs = amqp.Table{"x-queue-type": "classic"}

func mismatch(kind, name string, err error) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return fmt.Errorf("topology: declare %s %s: %w", kind, name, err)
	}
	if name == MainQueue {
		// Most likely a classic queue from before quorum became the
		// default: the broker names only the first argument that differs.
		return fmt.Errorf("topology: %s exists with other arguments than paysvc declares, most likely another "+
			"queue type than amqp.queueType asks for (quorum by default since the production-topology release). "+
			"Either set amqp.queueType to the queue's type (a queue an earlier paysvc declared), or migrate (a queue "+
			"paysvc did not declare, such as a hand-written consumer's, always needs it): stop the producers, drain the "+
			"queue, stop paysvc, delete %s, start paysvc (it declares the new one), start the producers (docs/design.md, "+
			"\"Migrating to quorum queues\"): %w", MainQueue, MainQueue, err)
	}
	return fmt.Errorf("topology: %s %s exists with other arguments than paysvc declares; drain and delete it "+
		"(paysvc declares it again), or restore the configuration it was made with (docs/design.md, \"Migrating to "+
		"quorum queues\"): %w", kind, name, err)
}
