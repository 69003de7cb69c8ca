// Package outbox delivers the payment-success notice without letting it touch
// the payment: the notice is written in the payment's own transaction, and a
// dispatcher publishes it afterwards, with publisher confirms and its own
// retries. A notice that cannot be sent never causes a redelivery of the
// payment message, let alone a second charge.
package outbox

import (
	"encoding/json"
	"time"

	"github.com/paysvc/paysvc/internal/money"
)

// Notice topology: ex.pay.notify (topic) → q.pay.notify, routing key
// pay.success. Notices are kept in q.pay.notify for whoever sends them on.
const (
	Exchange   = "ex.pay.notify"
	Queue      = "q.pay.notify"
	DeadQueue  = "q.pay.notify.dead"
	RoutingKey = "pay.success"
)

// EventPaymentSucceeded is the event type of a payment-success notice.
const EventPaymentSucceeded = "PAYMENT_SUCCEEDED"

// Notice is the payload published to ex.pay.notify.
type Notice struct {
	Event   string `json:"event"`
	OrderNo string `json:"orderNo"`
	UserID  int64  `json:"userId"`
	Amount  string `json:"amount"`
	PaidAt  string `json:"paidAt"`
}

// PaymentSucceeded is the JSON payload of a payment-success notice.
func PaymentSucceeded(orderNo string, userID int64, amount money.Cents, paidAt time.Time) []byte {
	b, _ := json.Marshal(Notice{ // a struct of strings and an int: cannot fail
		Event: EventPaymentSucceeded, OrderNo: orderNo, UserID: userID,
		Amount: amount.String(), PaidAt: paidAt.UTC().Format(time.RFC3339Nano),
	})
	return b
}
