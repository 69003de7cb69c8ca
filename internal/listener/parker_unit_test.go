package listener

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The parked reason is what moved the message into the terminal queue
// last: paysvc (its own copy, x-routed-to the terminal queue, or a copy
// from before x-routed-to whose newest x-death is a wait queue's) or the
// broker (anything else).
func TestParkedFromFinalReason(t *testing.T) {
	now := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	died := now.Add(-time.Minute)
	death := func(queue, reason string) []any {
		return []any{amqp.Table{"queue": queue, "reason": reason, "count": int64(1), "time": died}}
	}
	body := []byte(`{"orderNo":"FR1","userId":1,"amount":"1.00"}`)
	for _, tc := range []struct {
		name     string
		headers  amqp.Table
		class    string
		errorHas string
		failedAt time.Time
	}{
		{"paysvc's terminal copy, after a wait queue",
			amqp.Table{HeaderRoutedTo: TerminalQueue, HeaderErrorClass: "balance_not_enough", HeaderLastError: "gave up",
				"x-death": death(WaitQueue(time.Second), "expired")},
			"balance_not_enough", "gave up", now},
		{"a retry copy the broker dead-lettered from the main queue",
			amqp.Table{HeaderRoutedTo: WaitQueue(time.Second), HeaderErrorClass: "balance_not_enough", HeaderLastError: "not enough",
				"x-death": death(MainQueue, "delivery_limit")},
			ClassDeadLettered, "dead-lettered by the broker: delivery_limit from q.pay.success (before that, paysvc: balance_not_enough: not enough)", died},
		{"a copy from before x-routed-to that paysvc sent to terminal",
			amqp.Table{HeaderErrorClass: "mismatch", HeaderLastError: "other amount", "x-death": death(WaitQueue(time.Second), "expired")},
			"mismatch", "other amount", now},
		{"a copy from before x-routed-to the broker rejected from the main queue",
			amqp.Table{HeaderErrorClass: "order_not_found", HeaderLastError: "missing", "x-death": death(MainQueue, "rejected")},
			ClassDeadLettered, "rejected from q.pay.success (before that, paysvc: order_not_found: missing)", died},
		{"a producer's message the broker dead-lettered, never seen by paysvc",
			amqp.Table{"x-death": death(MainQueue, "expired")},
			ClassDeadLettered, "dead-lettered by the broker: expired from q.pay.success", died},
	} {
		p := parkedFrom(amqp.Delivery{Body: body, Headers: tc.headers}, now)
		if p.ErrorClass != tc.class || !strings.Contains(p.LastError, tc.errorHas) || !p.LastFailedAt.Equal(tc.failedAt) {
			t.Errorf("%s: parked as %q, %q at %s; want %q, %q at %s", tc.name, p.ErrorClass, p.LastError, p.LastFailedAt,
				tc.class, tc.errorHas, tc.failedAt)
		}
	}
}
