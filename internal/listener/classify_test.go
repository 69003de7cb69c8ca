package listener

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
)

func TestClassify(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("order P1: pay: %w", err) }
	netErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	tests := []struct {
		err   error
		kind  Kind
		class Class
	}{
		{nil, Applied, ClassNone},
		{wrap(order.ErrAlreadyPaid), Duplicate, ClassNone},
		{wrap(fmt.Errorf("deduct: %w", account.ErrDuplicateFlow)), Duplicate, ClassNone},
		{fmt.Errorf("%w: amount", ErrBadMessage), Terminal, ClassBadMessage},
		{wrap(order.ErrMismatch), Terminal, ClassMismatch},
		{wrap(order.ErrNotPayable), Terminal, ClassNotPayable},
		{fmt.Errorf("%w: boom", errPanic), Terminal, ClassPanic},
		{wrap(fmt.Errorf("%w: %w", sqldb.ErrCommitUnknown, mysql.ErrInvalidConn)), Unavailable, ClassCommitUnknown},
		{fmt.Errorf("%w: %w", errRedisUnavailable, netErr), Unavailable, ClassRedisUnavailable},
		{wrap(netErr), Unavailable, ClassMySQLUnavailable},
		{wrap(driver.ErrBadConn), Unavailable, ClassMySQLUnavailable},
		{wrap(&mysql.MySQLError{Number: 1927, Message: "Connection was killed"}), Unavailable, ClassMySQLUnavailable},
		// The server refusing the pool's new connection: an outage, held,
		// not an attempt spent in a wait queue.
		{wrap(&mysql.MySQLError{Number: 1040, Message: "Too many connections"}), Unavailable, ClassMySQLUnavailable},
		{wrap(&mysql.MySQLError{Number: 1203, Message: "User already has more than 'max_user_connections'"}), Unavailable, ClassMySQLUnavailable},
		{wrap(&mysql.MySQLError{Number: 3032, Message: "The server is currently in offline mode"}), Unavailable, ClassMySQLUnavailable},
		// A Galera node that is not Synced: held, whatever the probe says.
		{wrap(&mysql.MySQLError{Number: 1047, Message: "WSREP has not yet prepared node for application use"}), Unavailable, ClassNodeNotReady},
		{wrap(fmt.Errorf("connection: 127.0.0.1:3306: %w: wsrep_local_state 2 (Donor/Desynced)", sqldb.ErrNodeNotReady)), Unavailable, ClassNodeNotReady},
		{wrap(order.ErrNotFound), Retryable, ClassOrderNotFound},
		{wrap(account.ErrInsufficientBalance), Retryable, ClassBalance},
		{wrap(account.ErrNoAccount), Retryable, ClassNoAccount},
		{errInFlight, Retryable, ClassInFlight},
		{wrap(&mysql.MySQLError{Number: 1213}), Retryable, ClassDeadlock},
		{wrap(&mysql.MySQLError{Number: 1205}), Retryable, ClassLockWait},
		{wrap(fmt.Errorf("user 7: %w: %w", order.ErrAccountLocked, &mysql.MySQLError{Number: 1205})), Retryable, ClassLockWait},
		{wrap(order.ErrAccountLocked), Retryable, ClassLockWait},
		{wrap(&mysql.MySQLError{Number: 1146, Message: "no such table"}), Unavailable, ClassMySQLError},
		{wrap(&mysql.MySQLError{Number: 1142, Message: "command denied"}), Unavailable, ClassMySQLError},
		{wrap(&mysql.MySQLError{Number: 1406, Message: "data too long"}), Retryable, ClassUnknown},
		{wrap(fmt.Errorf("read: %w", context.DeadlineExceeded)), Unavailable, ClassTimeout},
		{context.Canceled, Unavailable, ClassTimeout},
		{errors.New("something new"), Retryable, ClassUnknown},
	}
	for _, tt := range tests {
		kind, class := classify(tt.err)
		if kind != tt.kind || class != tt.class {
			t.Errorf("classify(%v) = %v, %q; want %v, %q", tt.err, kind, class, tt.kind, tt.class)
		}
	}
}
