package order

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// Payment is a validated "payment succeeded" message.
type Payment struct {
	OrderNo string
	UserID  int64
	Amount  money.Cents
	// Trace is the W3C traceparent the payment's notice is published with
	// ("" for none): the trace of the message that paid it.
	Trace string
}

// Store reads orders and applies payments.
type Store struct {
	db *sqlx.DB
	// Attempts bounds how often Pay runs its transaction when it hits a
	// deadlock or a lost connection.
	Attempts int
	// OnRetry, if set, is told each time a transaction (a payment's or a
	// group's) is run again after such an error. Set it before use.
	OnRetry func(err error)
	// NoticeLease, when set, writes each payment's notice leased to this
	// process for that long (attempts 1, next_attempt_at ahead), and
	// OnCommitted is told the order numbers of every committed set: the
	// process publishes their notices itself (outbox.Dispatcher.Offer),
	// with no poll and no lease update per notice. A process that dies
	// first leaves them to any dispatcher's poll when the lease ends. Set
	// both before use, or neither.
	NoticeLease time.Duration
	OnCommitted func(orderNos []string)
	// OnHeld, if set, is told each payment a Grouper keeps out of its
	// groups because its account or order row was found locked by another
	// transaction (it waits alone, or is answered ErrAccountLocked), and
	// OnLocked each such row when first found locked: a user's account
	// (orderNo "") once a payment run alone waited it out, or an order
	// (userID 0). Set them before use.
	OnHeld   func()
	OnLocked func(userID int64, orderNo string)
}

// NewStore returns a Store over db.
func NewStore(db *sqlx.DB) *Store { return &Store{db: db, Attempts: 3} }

// Pay applies p exactly once, in one transaction: order INIT→PAID, a
// PAY_DEDUCT flow, the balance deduction, and the payment-success notice in
// the outbox, sent as one round trip plus COMMIT (write.go, a set of one).
//
// It returns nil when this call applied the payment, and otherwise:
// ErrAlreadyPaid or account.ErrDuplicateFlow (a duplicate: ack),
// ErrNotFound, account.ErrInsufficientBalance, account.ErrNoAccount
// (retryable), ErrNotPayable (a status paysvc does not know) and
// ErrMismatch (terminal), an error wrapping
// sqldb.ErrCommitUnknown (don't ack: re-read), or a database error. Every
// error leaves nothing changed, except that after ErrCommitUnknown the
// payment may have been applied.
func (s *Store) Pay(ctx context.Context, p Payment) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = s.payAlone(ctx, p)
		if err == nil || !sqldb.Transient(err) || attempt >= s.Attempts {
			break
		}
		// Deadlock or lost connection: the transaction was rolled back as a
		// whole; run it again after a jittered pause. A lock wait timeout is
		// returned as it is: it has waited mysql.lockWaitTimeout already, and
		// the caller retries it later.
		s.retried(err)
		pause := time.Duration(attempt)*20*time.Millisecond + rand.N(30*time.Millisecond)
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(pause):
		}
	}
	if err != nil {
		return fmt.Errorf("order %s: pay: %w", p.OrderNo, err)
	}
	return nil
}

func (s *Store) retried(err error) {
	if s.OnRetry != nil {
		s.OnRetry(err)
	}
}

func (s *Store) heldOut() {
	if s.OnHeld != nil {
		s.OnHeld()
	}
}

func (s *Store) locked(userID int64, orderNo string) {
	if s.OnLocked != nil {
		s.OnLocked(userID, orderNo)
	}
}

// Check reads the order and says whether p could be applied to it now,
// without changing anything: nil if the order is INIT with p's user and
// amount, else the error Pay would return (ErrAlreadyPaid, ErrNotFound,
// ErrMismatch, ErrNotPayable or a database error).
func (s *Store) Check(ctx context.Context, p Payment) error {
	if err := check(ctx, s.db, p); err != nil {
		return fmt.Errorf("order %s: check: %w", p.OrderNo, err)
	}
	return nil
}

// check reads the order and says why p cannot be applied, or nil.
func check(ctx context.Context, q sqlx.QueryerContext, p Payment) error {
	var o struct {
		Status Status      `db:"status"`
		UserID int64       `db:"user_id"`
		Amount money.Cents `db:"amount"`
	}
	err := sqlx.GetContext(ctx, q, &o, "SELECT status, user_id, amount FROM t_order WHERE order_no = ?", p.OrderNo)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("read order: %w", err)
	}
	if o.UserID != p.UserID || o.Amount != p.Amount {
		return fmt.Errorf("%w: order has user %d amount %s, message user %d amount %s (status %s)",
			ErrMismatch, o.UserID, o.Amount, p.UserID, p.Amount, o.Status)
	}
	switch o.Status {
	case Paid, Settled, Refunded:
		// REFUNDED too: the payment was applied once (then refunded); a
		// redelivered or replayed copy is a duplicate.
		return fmt.Errorf("%w (%s)", ErrAlreadyPaid, o.Status)
	case Init:
		return nil
	}
	return fmt.Errorf("%w: unknown status %q", ErrNotPayable, o.Status)
}

// Ping checks that the database answers and takes writes: a primary that
// failed over to read-only answers a ping too.
func (s *Store) Ping(ctx context.Context) error {
	var readOnly int
	if err := s.db.GetContext(ctx, &readOnly, "SELECT @@global.read_only"); err != nil {
		return err
	}
	if readOnly != 0 {
		return ErrReadOnly
	}
	return nil
}

// NoticeTrace returns the traceparent the payment-success notice of
// orderNo was written with: the trace of the message that paid it.
func (s *Store) NoticeTrace(ctx context.Context, orderNo string) (string, error) {
	var tp string
	err := s.db.GetContext(ctx, &tp, "SELECT traceparent FROM t_outbox WHERE biz_no = ? AND event_type = ?",
		orderNo, outbox.EventPaymentSucceeded)
	if err != nil {
		return "", fmt.Errorf("order %s: read its notice's trace: %w", orderNo, err)
	}
	return tp, nil
}

// NodeReady reports whether the server is a Galera node that is not Synced
// now (an error for which sqldb.IsNodeNotReady holds): the reason a write
// stalls or fails on a donor, a joiner or a node cut off. nil on a server
// without Galera.
func (s *Store) NodeReady(ctx context.Context) error {
	return sqldb.NodeReady(ctx, s.db.DB)
}

// ErrReadOnly: the server is read-only (a replica, or a primary that failed
// over).
var ErrReadOnly = errors.New("mysql is read-only")

// ErrWritesStalled: a write probe did not commit within its bound while
// MySQL answered reads.
var ErrWritesStalled = errors.New("mysql does not commit writes")

// probeWrite is the write probe's transaction, one round trip: a write that
// changes nothing on each table a payment writes (each takes the table's
// write locks: a metadata lock, a global read lock or a read-only server
// stops it as it would stop a payment), then a real row of the instance's
// own, which the COMMIT must make durable (a full disk, a stalled fsync, a
// semi-synchronous wait stop that). Read-committed, keyed by primary key:
// it takes no row lock a payment waits for, and none a payment holds stops
// it.
const probeWrite = `START TRANSACTION;
UPDATE t_order SET status = status WHERE order_no = '';
UPDATE t_account SET balance = balance WHERE user_id = 0;
INSERT INTO t_account_flow (user_id, amount, biz_no, type) SELECT 0, 0, '', '' FROM DUAL WHERE FALSE;
INSERT INTO t_outbox (event_type, biz_no, payload) SELECT '', '', '' FROM DUAL WHERE FALSE;
INSERT INTO t_write_probe (instance, probed_at) VALUES (?, CURRENT_TIMESTAMP(3))
  ON DUPLICATE KEY UPDATE probed_at = CURRENT_TIMESTAMP(3);
COMMIT`

// ProbeWrites commits a write as a payment would, within ctx: nil when it
// committed; an error wrapping ErrWritesStalled when ctx ended first (the
// server answered nothing, or a lock or a stall held the write); any other
// error as it came. instance keys the probe's own row (a host name: one row
// per instance).
func (s *Store) ProbeWrites(ctx context.Context, instance string) error {
	if len(instance) > 64 {
		instance = instance[:64]
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return probeErr(ctx, fmt.Errorf("connection: %w", err))
	}
	defer conn.Close()
	var opErr error
	rawErr := conn.Raw(func(dc any) error {
		ex := dc.(driver.ExecerContext)
		if _, err := ex.ExecContext(ctx, probeWrite, []driver.NamedValue{{Ordinal: 1, Value: instance}}); err != nil {
			// A statement refused mid-way leaves the transaction open:
			// roll it back, or discard the connection.
			opErr = err
			return rollbackOn(ctx, ex)
		}
		return nil
	})
	if opErr == nil {
		opErr = rawErr
	}
	return probeErr(ctx, opErr)
}

// probeErr says a probe that ran out of time stalled.
func probeErr(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%w: no commit within the probe's bound: %w", ErrWritesStalled, err)
	case sqldb.IsLockWait(err):
		// No payment locks the rows the probe writes: the lock is another
		// instance's probe of the same name, whose commit does not come.
		return fmt.Errorf("%w: the probe's row is held by a write that does not commit: %w", ErrWritesStalled, err)
	}
	return fmt.Errorf("write probe: %w", err)
}
