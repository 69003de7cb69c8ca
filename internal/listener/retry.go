package listener

import (
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Retry headers on copies published to the wait and terminal queues.
const (
	HeaderRetryCount    = "x-retry-count"
	HeaderErrorClass    = "x-error-class"
	HeaderLastError     = "x-last-error"
	HeaderFirstFailedAt = "x-first-failed-at"
	HeaderLastFailedAt  = "x-last-failed-at"
	HeaderInFlightCount = "x-inflight-count"
	// HeaderRequeueCount counts the times this message went back to the
	// main queue alone, without spending an attempt, because its outcome
	// was unknown or its handling timed out while every dependency answered.
	HeaderRequeueCount = "x-requeue-count"
	// HeaderRoutedTo names the queue paysvc published this copy to. A
	// message in the terminal queue whose x-routed-to is not the terminal
	// queue got there through the broker (delivery limit, rejection,
	// expiry), after whatever paysvc had decided before.
	HeaderRoutedTo = "x-routed-to"
)

// maxRequeuesAlone bounds the requeues without attempt one message can take
// per attempt; past it the next failure spends an attempt like any retry.
const maxRequeuesAlone = 3

// maxInFlightRetries bounds the retries that wait out another holder's
// lease without spending an attempt; past it they spend attempts like any
// other retry. Leases expire, so it is reached only by a key that never does.
const maxInFlightRetries = 100

const maxErrorText = 1024

// RetryPolicy says where a failed message goes next.
type RetryPolicy struct {
	Delays      []time.Duration // wait for attempt n is Delays[n-1]; the last repeats
	MaxAttempts int             // retries before the terminal queue
}

// retryCount reads x-retry-count; absent or malformed counts as 0.
func retryCount(h amqp.Table) int { return headerCount(h, HeaderRetryCount) }

func headerCount(h amqp.Table, key string) int {
	switch v := h[key].(type) {
	case int8:
		return max(int(v), 0)
	case int16:
		return max(int(v), 0)
	case int32:
		return max(int(v), 0)
	case int64:
		return int(max(v, 0))
	case int:
		return max(v, 0)
	}
	return 0
}

// next returns the queue a failed message goes to and the retry count its
// copy carries. A terminal kind, or a retryable one past MaxAttempts, goes to
// the terminal queue with the count unchanged.
func (p RetryPolicy) next(kind Kind, count int) (queue string, newCount int) {
	if kind == Terminal || count >= p.MaxAttempts || len(p.Delays) == 0 {
		return TerminalQueue, count
	}
	i := min(count, len(p.Delays)-1)
	return WaitQueue(p.Delays[i]), count + 1
}

// inFlight routes a message whose order another holder has claimed: to the
// shortest wait queue that outlasts the holder's remaining lease (or the
// longest), without spending an attempt, so that a worker that died holding
// the key cannot walk an unpaid payment into the terminal queue. It returns
// false when the in-flight retries are spent.
func (p RetryPolicy) inFlight(inflight int, remaining time.Duration) (string, bool) {
	if inflight >= maxInFlightRetries || len(p.Delays) == 0 {
		return "", false
	}
	best, longest := time.Duration(-1), p.Delays[0]
	for _, d := range p.Delays {
		longest = max(longest, d)
		if d >= remaining && (best < 0 || d < best) {
			best = d
		}
	}
	if best < 0 {
		best = longest
	}
	return WaitQueue(best), true
}

// failedCopy builds the copy of d published to queue (a wait queue, the
// terminal queue, or the main queue for a requeue alone).
func failedCopy(d amqp.Delivery, queue string, count int, class Class, cause error, now time.Time) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range d.Headers {
		h[k] = v
	}
	h[HeaderRoutedTo] = queue
	delete(h, HeaderRequeueCount) // a fresh budget per attempt; requeue sets its own
	text := cause.Error()
	if len(text) > maxErrorText {
		text = text[:maxErrorText]
	}
	ts := now.UTC().Format(time.RFC3339Nano)
	h[HeaderRetryCount] = int32(count)
	h[HeaderErrorClass] = string(class)
	h[HeaderLastError] = text
	h[HeaderLastFailedAt] = ts
	if _, ok := h[HeaderFirstFailedAt].(string); !ok {
		h[HeaderFirstFailedAt] = ts
	}
	return amqp.Publishing{
		Headers:         h,
		ContentType:     d.ContentType,
		ContentEncoding: d.ContentEncoding,
		DeliveryMode:    amqp.Persistent,
		Priority:        d.Priority,
		CorrelationId:   d.CorrelationId,
		MessageId:       d.MessageId,
		Timestamp:       d.Timestamp,
		Type:            d.Type,
		AppId:           d.AppId,
		Body:            d.Body,
	}
}
