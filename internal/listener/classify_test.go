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
		name  string
		err   error
		kind  Kind
		class Class
	}{
		{"no error", nil, Applied, ClassNone},
		{"order already paid", wrap(order.ErrAlreadyPaid), Duplicate, ClassNone},
		{"duplicate flow", wrap(fmt.Errorf("deduct: %w", account.ErrDuplicateFlow)), Duplicate, ClassNone},
		{"bad message", fmt.Errorf("%w: amount", ErrBadMessage), Terminal, ClassBadMessage},
		{"amount mismatch", wrap(order.ErrMismatch), Terminal, ClassMismatch},
		{"order not payable", wrap(order.ErrNotPayable), Terminal, ClassNotPayable},
		{"panic", fmt.Errorf("%w: boom", errPanic), Terminal, ClassPanic},
		{"commit outcome unknown", wrap(fmt.Errorf("%w: %w", sqldb.ErrCommitUnknown, mysql.ErrInvalidConn)), Unavailable, ClassCommitUnknown},
		{"redis unavailable", fmt.Errorf("%w: %w", errRedisUnavailable, netErr), Unavailable, ClassRedisUnavailable},
		{"mysql dial refused", wrap(netErr), Unavailable, ClassMySQLUnavailable},
		{"driver bad connection", wrap(driver.ErrBadConn), Unavailable, ClassMySQLUnavailable},
		{"connection killed", wrap(&mysql.MySQLError{Number: 1927, Message: "Connection was killed"}), Unavailable, ClassMySQLUnavailable},
		// The server refusing the pool's new connection: an outage, held,
		// not an attempt spent in a wait queue.
		{"too many connections", wrap(&mysql.MySQLError{Number: 1040, Message: "Too many connections"}), Unavailable, ClassMySQLUnavailable},
		{"max user connections", wrap(&mysql.MySQLError{Number: 1203, Message: "User already has more than 'max_user_connections'"}), Unavailable, ClassMySQLUnavailable},
		{"server offline mode", wrap(&mysql.MySQLError{Number: 3032, Message: "The server is currently in offline mode"}), Unavailable, ClassMySQLUnavailable},
		// A Galera node that is not Synced: held, whatever the probe says.
		{"wsrep node not prepared", wrap(&mysql.MySQLError{Number: 1047, Message: "WSREP has not yet prepared node for application use"}), Unavailable, ClassNodeNotReady},
		{"galera node not synced", wrap(fmt.Errorf("connection: 127.0.0.1:3306: %w: wsrep_local_state 2 (Donor/Desynced)", sqldb.ErrNodeNotReady)), Unavailable, ClassNodeNotReady},
		{"order not found", wrap(order.ErrNotFound), Retryable, ClassOrderNotFound},
		{"balance not enough", wrap(account.ErrInsufficientBalance), Retryable, ClassBalance},
		{"no account", wrap(account.ErrNoAccount), Retryable, ClassNoAccount},
		{"claim in flight", errInFlight, Retryable, ClassInFlight},
		{"deadlock", wrap(&mysql.MySQLError{Number: 1213}), Retryable, ClassDeadlock},
		{"lock wait timeout", wrap(&mysql.MySQLError{Number: 1205}), Retryable, ClassLockWait},
		{"account locked on lock wait", wrap(fmt.Errorf("user 7: %w: %w", order.ErrAccountLocked, &mysql.MySQLError{Number: 1205})), Retryable, ClassLockWait},
		{"account locked", wrap(order.ErrAccountLocked), Retryable, ClassLockWait},
		{"no such table", wrap(&mysql.MySQLError{Number: 1146, Message: "no such table"}), Unavailable, ClassMySQLError},
		{"command denied", wrap(&mysql.MySQLError{Number: 1142, Message: "command denied"}), Unavailable, ClassMySQLError},
		{"data too long", wrap(&mysql.MySQLError{Number: 1406, Message: "data too long"}), Retryable, ClassUnknown},
		{"deadline exceeded", wrap(fmt.Errorf("read: %w", context.DeadlineExceeded)), Unavailable, ClassTimeout},
		{"canceled", context.Canceled, Unavailable, ClassTimeout},
		{"unknown error", errors.New("something new"), Retryable, ClassUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, class := classify(tt.err)
			if kind != tt.kind || class != tt.class {
				t.Errorf("classify(%v) = %v, %q; want %v, %q", tt.err, kind, class, tt.kind, tt.class)
			}
		})
	}
}
