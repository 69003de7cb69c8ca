// Package listener consumes "payment succeeded" messages from RabbitMQ and
// turns each outcome into a broker action. It is the only package that acks.
//
// For every delivery: decode strictly (bad input → terminal), claim the order's
// Redis key, apply the payment in one MySQL transaction, and only then ack.
// A retryable failure publishes a copy to the wait queue for its attempt and
// acks the original; a terminal one publishes to q.pay.dlx.terminal. Both
// publishes use publisher confirms and the mandatory flag: an unconfirmed or
// returned copy nacks the original back onto the queue. A dependency that is
// down (Redis under CLOSED, MySQL) requeues the message without spending an
// attempt and pauses consumption until the dependency answers again.
//
// Nothing is acked unless its effect is committed, it is provably a
// duplicate, or a copy sits confirmed in a wait or terminal queue.
package listener
