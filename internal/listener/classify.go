package listener

import (
	"context"
	"errors"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// Kind is what the broker is told to do about an outcome.
type Kind int

const (
	// Applied: this delivery's payment committed. Ack.
	Applied Kind = iota + 1
	// Duplicate: the payment was applied before. Ack.
	Duplicate
	// Retryable: publish a copy to the next wait queue (or terminal once the
	// attempts are spent), then ack.
	Retryable
	// Terminal: publish a copy to the terminal queue with the reason, then ack.
	Terminal
	// Unavailable: a dependency is down or the commit outcome is unknown.
	// Requeue without spending an attempt and pause until it answers.
	Unavailable
)

// Class names an error for headers, logs and metrics.
type Class string

// The error classes.
const (
	ClassNone             Class = ""
	ClassBadMessage       Class = "bad_message"
	ClassMismatch         Class = "mismatch"
	ClassNotPayable       Class = "not_payable"
	ClassPanic            Class = "panic"
	ClassOrderNotFound    Class = "order_not_found"
	ClassBalance          Class = "balance_not_enough"
	ClassNoAccount        Class = "account_not_found"
	ClassInFlight         Class = "in_flight"
	ClassDeadlock         Class = "deadlock"
	ClassLockWait         Class = "lock_wait_timeout"
	ClassUnknown          Class = "unknown"
	ClassMySQLUnavailable Class = "mysql_unavailable"
	ClassNodeNotReady     Class = "mysql_node_not_ready"
	ClassCommitUnknown    Class = "commit_unknown"
	ClassRedisUnavailable Class = "redis_unavailable"
	ClassTimeout          Class = "timeout"
	ClassMySQLError       Class = "mysql_error"
)

// Errors the listener itself produces.
var (
	errInFlight         = errors.New("order is in flight in another worker")
	errPanic            = errors.New("panic while handling")
	errRedisUnavailable = errors.New("redis unavailable")
)

// classify maps an error from handling to its kind and class. Unknown errors
// are retryable: the retry budget bounds them.
func classify(err error) (Kind, Class) {
	switch {
	case err == nil:
		return Applied, ClassNone
	case errors.Is(err, order.ErrAlreadyPaid), errors.Is(err, account.ErrDuplicateFlow):
		return Duplicate, ClassNone
	case errors.Is(err, ErrBadMessage):
		return Terminal, ClassBadMessage
	case errors.Is(err, order.ErrMismatch):
		return Terminal, ClassMismatch
	case errors.Is(err, order.ErrNotPayable):
		return Terminal, ClassNotPayable
	case errors.Is(err, errPanic):
		return Terminal, ClassPanic
	case errors.Is(err, sqldb.ErrCommitUnknown):
		return Unavailable, ClassCommitUnknown
	case errors.Is(err, errRedisUnavailable):
		return Unavailable, ClassRedisUnavailable
	case sqldb.IsNodeNotReady(err):
		// A Galera node that is not Synced refused it (1047) or the pool
		// found none: nothing ran, and behind a proxy the next connection
		// may reach another node, so the message is held and tried again
		// however the probe fares (process).
		return Unavailable, ClassNodeNotReady
	case sqldb.IsConnection(err):
		return Unavailable, ClassMySQLUnavailable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// The handling bound ran out (a black-holed server, an exhausted
		// pool) or paysvc is stopping: not the message's fault.
		return Unavailable, ClassTimeout
	case sqldb.IsSchemaOrPermission(err):
		// A missing table or column, a revoked grant: every message would
		// fail alike, so wait for the operator instead of spending attempts.
		return Unavailable, ClassMySQLError
	case errors.Is(err, order.ErrNotFound):
		return Retryable, ClassOrderNotFound
	case errors.Is(err, account.ErrInsufficientBalance):
		return Retryable, ClassBalance
	case errors.Is(err, account.ErrNoAccount):
		return Retryable, ClassNoAccount
	case errors.Is(err, errInFlight):
		return Retryable, ClassInFlight
	case sqldb.IsDeadlock(err):
		return Retryable, ClassDeadlock
	case sqldb.IsLockWait(err), errors.Is(err, order.ErrAccountLocked):
		// A row stayed locked for mysql.lockWaitTimeout (an operator's
		// open transaction, say), or the account row is known locked and
		// another payment of the user waits for it: this payment waits in
		// a wait queue and spends an attempt; the others go on.
		return Retryable, ClassLockWait
	}
	return Retryable, ClassUnknown
}
