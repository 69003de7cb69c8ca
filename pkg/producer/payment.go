package producer

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
)

// Payment is one payment-succeeded message (docs/contract/payment.schema.json).
type Payment struct {
	OrderNo string // 1-64 of [A-Za-z0-9_.:-], starting with a letter or digit
	UserID  int64  // > 0
	// Amount is the amount paid as decimal text, e.g. "199.00" or "0.5":
	// > 0, at most two decimals, no exponent, no sign, at most 16 digits
	// before the point. It must equal the order's amount. It is sent as a
	// JSON string, never through a float.
	Amount string
	// Traceparent is the W3C trace context the payment belongs to (the
	// producer's current span); empty, the producer starts a trace.
	Traceparent string
}

// ErrInvalid: the payment breaks the contract; it is not published (paysvc
// would park it as bad_message).
var ErrInvalid = errors.New("producer: invalid payment")

var (
	orderNoPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$`)
	amountPattern  = regexp.MustCompile(`^(?:[1-9][0-9]{0,15}(?:\.[0-9]{1,2})?|0\.(?:0[1-9]|[1-9][0-9]?))$`)
)

// Message checks the payment against the contract and encodes it.
func (p Payment) Message() (Message, error) {
	switch {
	case !orderNoPattern.MatchString(p.OrderNo):
		return Message{}, fmt.Errorf("%w: orderNo %.80q must be 1-64 of [A-Za-z0-9_.:-], starting with a letter or digit", ErrInvalid, p.OrderNo)
	case p.UserID <= 0:
		return Message{}, fmt.Errorf("%w: order %s: userId %d must be positive", ErrInvalid, p.OrderNo, p.UserID)
	case !amountPattern.MatchString(p.Amount):
		return Message{}, fmt.Errorf("%w: order %s: amount %.40q must be > 0 with at most two decimals, like 199.00", ErrInvalid, p.OrderNo, p.Amount)
	}
	body, err := json.Marshal(struct {
		OrderNo string `json:"orderNo"`
		UserID  int64  `json:"userId"`
		Amount  string `json:"amount"`
	}{p.OrderNo, p.UserID, p.Amount})
	if err != nil { // strings and an integer: cannot fail
		return Message{}, err
	}
	return Message{Body: body, Traceparent: p.Traceparent}, nil
}

// Message is a payment message as it is published: its JSON body and its
// trace context. Payment.Message builds one; build one yourself only to
// publish a body of your own making (a test's malformed message, say):
// paysvc parks a body outside the contract as bad_message.
type Message struct {
	Body        []byte
	Traceparent string // empty: the producer starts a trace
}

// NewTraceparent starts a trace: a W3C traceparent with a random trace id
// and span id, sampled. Log it with the payment to find the payment's
// trace in paysvc's logs (paysvc trace ORDER shows it).
func NewTraceparent() string {
	var id [24]byte
	for {
		rand.Read(id[:]) // never fails (crypto/rand)
		if !allZero(id[:16]) && !allZero(id[16:]) {
			break
		}
	}
	return "00-" + hex.EncodeToString(id[:16]) + "-" + hex.EncodeToString(id[16:]) + "-01"
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
