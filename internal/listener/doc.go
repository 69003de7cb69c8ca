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
//   - session.go: session reads as a connection's life: connect (the
//     consuming connection and the copies' own), openConsumer (declare the
//     topology, topology.go; QoS; consume q.pay.success), startWorkers,
//     then dispatch hands each delivery to a worker until the session
//     ends, and teardown cancels the consumer, drains the workers, returns
//     what no worker started and closes.
//   - process.go: a worker's process reads as one delivery's story:
//     handleThroughOutages calls handle and holds the delivery while a
//     dependency is down (hold); route decides its fate; settle tells the
//     broker (publish the copy, ack or nack; acks coalesce in ack.go);
//     report logs the "message handled" line, counts, records the trace
//     event and exports the span.
//   - handle.go: handle decodes the body (message.go), claims the Redis key
//     (claim → claimState), checks what the claim found against the
//     database (checkClaim), pays through the Payer (pay, into an
//     order.Grouper), marks the key done or releases it (finishClaim), and
//     classifies the error (classify.go) into an outcome: a Kind and a
//     Class.
//   - route.go: route is where a message's fate is decided, a pure function
//     of the outcome, the delivery's headers and the RetryPolicy (retry.go):
//     its Result (FIRST, DUPLICATE, RETRY, TERMINAL, REQUEUE) and the copy
//     to publish, if any.
//
// Messages that end in the terminal queue are parked in t_dead_letter by the
// Parker (parker.go); the Monitor (monitor.go) samples the queues.
package listener
