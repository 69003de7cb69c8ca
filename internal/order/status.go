// Package order owns orders and their state machine, and applies a payment:
// the INIT→PAID compare-and-swap, the account flow and the balance deduction
// in one MySQL transaction.
package order

import "errors"

// Status is an order's state. INIT→PAID is the only change paysvc makes.
type Status string

// The closed set of states.
const (
	Init     Status = "INIT"
	Paid     Status = "PAID"
	Settled  Status = "SETTLED"
	Refunded Status = "REFUNDED"
)

var (
	// ErrNotFound: no such order yet (its creation may not be visible).
	// Retryable.
	ErrNotFound = errors.New("order: not found")
	// ErrAlreadyPaid: PAID, SETTLED or REFUNDED (paid, then refunded) with
	// the same user and amount. A duplicate: ack.
	ErrAlreadyPaid = errors.New("order: already paid")
	// ErrNotPayable: a status paysvc does not know. Terminal.
	ErrNotPayable = errors.New("order: not payable")
	// ErrMismatch: the message's user or amount differ from the order's.
	// Terminal.
	ErrMismatch = errors.New("order: amount or user mismatch")
)
