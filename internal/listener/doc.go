// Package listener consumes "payment succeeded" messages from RabbitMQ and
// turns each outcome into a broker action. It is the only package that acks.
//
// For every delivery: decode strictly (bad input → terminal), claim the order's
// Redis key, apply the payment in one MySQL transaction, and only then ack.
// A retryable failure publishes a copy to the wait queue for its attempt and
// acks the original; a terminal one publishes to q.pay.dlx.terminal. Both
// publishes use publisher confirms and the mandatory flag: an unconfirmed or
// returned copy nacks the original back onto the queue. A dependency that is
// down (Redis under CLOSED, MySQL) pauses consumption: the worker holds its
// message, spending no attempt, until the dependency answers again (or the
// session ends: then the message goes back onto the queue).
//
// Nothing is acked unless its effect is committed, it is provably a
// duplicate, or a copy sits confirmed in a wait or terminal queue.
//
// # One delivery, file by file
//
//   - consumer.go: Consumer.Run waits for MySQL (and Redis under CLOSED),
//     runs sessions and reconnects (broker.Reconnect); readiness and the
//     dependency probes.
//   - session.go: session dials, declares the topology (topology.go),
//     consumes q.pay.success and starts the workers; dispatch hands each
//     delivery to one. On the way out it cancels the consumer, drains the
//     workers and closes.
//   - process.go: a worker's process takes the delivery to its end. It
//     calls handle, holds the delivery while a dependency is down (hold),
//     asks route what to tell the broker, then does it: publish the copy,
//     ack or nack (acks coalesce in ack.go), and logs the "message handled"
//     line, counts, records the trace event and exports the span.
//   - handle.go: handle decodes the body (message.go), claims the Redis key
//     (claim → claimState), pays through the Payer (an order.Grouper),
//     marks the key done or releases it, and classifies the error
//     (classify.go) into an outcome: a Kind and a Class.
//   - route.go: route is where a message's fate is decided, a pure function
//     of the outcome, the delivery's headers and the RetryPolicy (retry.go):
//     its Result (FIRST, DUPLICATE, RETRY, TERMINAL, REQUEUE) and the copy
//     to publish, if any.
//
// Messages that end in the terminal queue are parked in t_dead_letter by the
// Parker (parker.go); the Monitor (monitor.go) samples the queues.
package listener
