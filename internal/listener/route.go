package listener

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/paysvc/paysvc/internal/order"
)

// Result is the fate of one delivery. Its String is what the log line
// ("result"), paysvc_messages_total{result} and the trace events call it;
// alert rules and dashboards (deploy/) use those strings.
type Result int

const (
	// ResultFirst: this delivery applied the payment. Acked.
	ResultFirst Result = iota + 1
	// ResultDuplicate: the payment was applied before. Acked.
	ResultDuplicate
	// ResultRetry: a copy waits in a wait queue for the next attempt. Acked.
	ResultRetry
	// ResultTerminal: a copy sits in the terminal queue. Acked.
	ResultTerminal
	// ResultRequeue: back on the main queue without spending an attempt,
	// as a copy (the message alone) or by a nack (held through an outage
	// until the session ended, or a copy that could not be published).
	ResultRequeue
)

// results lists every Result.
var results = []Result{ResultFirst, ResultDuplicate, ResultRetry, ResultTerminal, ResultRequeue}

func (r Result) String() string {
	switch r {
	case ResultFirst:
		return "FIRST"
	case ResultDuplicate:
		return "DUPLICATE"
	case ResultRetry:
		return "RETRY"
	case ResultTerminal:
		return "TERMINAL"
	case ResultRequeue:
		return "REQUEUE"
	}
	return fmt.Sprintf("Result(%d)", int(r))
}

// action is what the broker is told about one delivery: route's answer,
// which process carries out.
type action struct {
	result Result
	// copy, if not nil, is published first; the delivery is acked once the
	// copy is confirmed, and nacked back onto the queue (REQUEUE) if not.
	copy *copySpec
	// nack, without a copy, sends the delivery back onto the queue instead
	// of acking it.
	nack bool
	// attempt is the retry count of the outcome: the copy's, or else the
	// delivery's.
	attempt int
	// err is the outcome's error as logged, recorded and exported: the
	// handling's, or why a requeue alone spent an attempt.
	err error
}

// copySpec says which copy of a delivery to publish (failedCopy) and where.
type copySpec struct {
	exchange string
	queue    string
	count    int   // x-retry-count
	class    Class // x-error-class
	cause    error // x-last-error
	inflight int   // x-inflight-count when > 0 (else the delivery's is kept)
	requeues int   // x-requeue-count when > 0 (else none: a fresh budget)
}

// publishing builds the copy of d, failing at now.
func (s *copySpec) publishing(d amqp.Delivery, now time.Time) amqp.Publishing {
	msg := failedCopy(d, s.queue, s.count, s.class, s.cause, now)
	if s.inflight > 0 {
		msg.Headers[HeaderInFlightCount] = int32(s.inflight)
	}
	if s.requeues > 0 {
		msg.Headers[HeaderRequeueCount] = int32(s.requeues)
	}
	return msg
}

// route decides a delivery's fate from its outcome, its headers and the
// retry policy; it does no I/O. letGo says the delivery was held through
// an outage until its session ended; an Unavailable outcome without it
// means every dependency answers and only this message failed.
func route(out outcome, h amqp.Table, p RetryPolicy, letGo bool) action {
	count := retryCount(h)
	kind, err := out.kind, out.err
	switch kind {
	case Applied:
		return action{result: ResultFirst, attempt: count, err: err}
	case Duplicate:
		return action{result: ResultDuplicate, attempt: count, err: err}
	case Unavailable:
		if letGo {
			// Held through an outage until the session ended: back to the
			// queue, spending no attempt.
			return action{result: ResultRequeue, nack: true, attempt: count, err: err}
		}
		// Every dependency answers: only this message failed (a statement
		// that timed out, a COMMIT whose reply was lost). It goes back alone
		// while the others flow; past maxRequeuesAlone it spends an attempt.
		n := headerCount(h, HeaderRequeueCount)
		if n < maxRequeuesAlone {
			return action{result: ResultRequeue, attempt: count, err: err, copy: &copySpec{
				exchange: RetryExchange, queue: MainQueue, count: count, class: out.class, cause: err, requeues: n + 1}}
		}
		kind = Retryable
		err = fmt.Errorf("requeued %d times without an attempt: %w", n, err)
	}
	// Retryable or Terminal.
	queue, n := p.next(kind, count)
	inflight := headerCount(h, HeaderInFlightCount)
	// Waiting out another holder spends no attempt: a lease another worker
	// holds, or an account row another payment of the user found locked
	// and still waits on alone (answered at once: spending an attempt each
	// time would burn the budget faster than the lock waits it stands for).
	if out.class == ClassInFlight || errors.Is(err, order.ErrAccountLocked) {
		if q, ok := p.inFlight(inflight, out.wait); ok {
			queue, n, inflight = q, count, inflight+1
		}
	}
	cause := err
	if kind == Retryable && queue == TerminalQueue {
		cause = fmt.Errorf("gave up after %d retries: %w", count, err)
	}
	result := ResultTerminal
	if queue != TerminalQueue {
		result = ResultRetry
	}
	return action{result: result, attempt: n, err: err, copy: &copySpec{
		exchange: DLXExchange, queue: queue, count: n, class: out.class, cause: cause, inflight: inflight}}
}
