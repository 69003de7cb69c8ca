package order

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/fault"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// chainSQL is the payment in one round trip: the transaction's start, then
// chainBody.
const chainSQL = "START TRANSACTION;\n" + chainBody

// chainBody is one payment's writes: the INIT→PAID CAS, then each next write
// only if the one before changed exactly one row (ROW_COUNT() = 1): the
// PAY_DEDUCT flow, the conditional balance update, the notice. The rows each
// statement changed come back together; COMMIT follows only if every one is
// 1. If the CAS changes no row, no statement of the body changes anything.
const chainBody = `UPDATE t_order SET status = 'PAID', pay_time = CURRENT_TIMESTAMP(3)
 WHERE order_no = ? AND status = 'INIT' AND user_id = ? AND amount = CAST(? AS DECIMAL(18,2));
INSERT INTO t_account_flow (user_id, amount, biz_no, type, remark)
 SELECT ?, CAST(? AS DECIMAL(18,2)), ?, 'PAY_DEDUCT', ? FROM DUAL WHERE ROW_COUNT() = 1;
UPDATE t_account SET balance = balance - CAST(? AS DECIMAL(18,2))
 WHERE user_id = ? AND balance >= CAST(? AS DECIMAL(18,2)) AND ROW_COUNT() = 1;
INSERT INTO t_outbox (event_type, biz_no, payload)
 SELECT ?, ?, ? FROM DUAL WHERE ROW_COUNT() = 1`

// chainArgs appends chainBody's parameters for p to args.
func chainArgs(args []driver.NamedValue, p Payment, now time.Time) []driver.NamedValue {
	amount := p.Amount.String()
	for _, v := range []any{
		p.OrderNo, p.UserID, amount,
		p.UserID, (-p.Amount).String(), p.OrderNo, "payment " + p.OrderNo,
		amount, p.UserID, amount,
		outbox.EventPaymentSucceeded, p.OrderNo, string(outbox.PaymentSucceeded(p.OrderNo, p.UserID, p.Amount, now)),
	} {
		args = append(args, driver.NamedValue{Ordinal: len(args) + 1, Value: v})
	}
	return args
}

// which of the chain's statements stopped it.
type stop int

const (
	stopNone    stop = iota
	stopCAS          // the order was not INIT with this user and amount
	stopBalance      // no account, or not enough balance
	stopOther        // a statement changed no row it should have
)

// payChained applies p in two round trips (the chain, then COMMIT), on a
// connection of its own: whatever happens, the connection goes back to the
// pool with no transaction open, or is discarded.
func (s *Store) payChained(ctx context.Context, p Payment) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connection: %w", err)
	}
	args := chainArgs(nil, p, time.Now())
	var opErr error
	why := stopNone
	rawErr := conn.Raw(func(dc any) error {
		ex := dc.(driver.ExecerContext)
		rollback := func() error { return rollbackOn(ctx, ex) }
		res, err := ex.ExecContext(ctx, chainSQL, args)
		if err != nil {
			opErr = err
			return rollback()
		}
		counts := res.(mysql.Result).AllRowsAffected() // START TRANSACTION, CAS, flow, balance, notice
		switch {
		case len(counts) != 5:
			opErr = fmt.Errorf("payment chain: %d results, want 5", len(counts))
			why = stopOther
		case counts[1] != 1:
			why = stopCAS
		case counts[2] != 1:
			why = stopOther
		case counts[3] != 1:
			why = stopBalance
		case counts[4] != 1:
			why = stopOther
		}
		if why != stopNone {
			return rollback()
		}
		fault.Point("mid_transaction")
		if _, err := ex.ExecContext(ctx, "COMMIT", nil); err != nil {
			opErr = fmt.Errorf("%w: %w", sqldb.ErrCommitUnknown, err)
			return driver.ErrBadConn
		}
		return nil
	})
	// Give the connection back before any diagnostic read: holding it while
	// taking another from a bounded pool can deadlock the pool.
	conn.Close()
	switch {
	case opErr != nil && sqldb.IsDuplicateKey(opErr):
		var me *mysql.MySQLError
		if errors.As(opErr, &me) && strings.Contains(me.Message, "uk_biz_no_type") {
			return fmt.Errorf("deduct %s: %w", p.OrderNo, account.ErrDuplicateFlow)
		}
		return opErr
	case opErr != nil:
		return opErr
	case rawErr != nil:
		return rawErr
	case why == stopCAS:
		if err := check(ctx, s.db, p); err != nil {
			return err
		}
		return errors.New("order changed during payment")
	case why == stopBalance:
		var exists int
		if err := s.db.GetContext(ctx, &exists, "SELECT COUNT(*) FROM t_account WHERE user_id = ?", p.UserID); err != nil {
			return fmt.Errorf("read account: %w", err)
		}
		if exists == 0 {
			return fmt.Errorf("deduct %s: user %d: %w", p.OrderNo, p.UserID, account.ErrNoAccount)
		}
		return fmt.Errorf("deduct %s: user %d, amount %s: %w", p.OrderNo, p.UserID, p.Amount, account.ErrInsufficientBalance)
	case why == stopOther:
		return errors.New("payment chain: a statement changed no row")
	}
	return nil
}

// rollbackOn rolls back the transaction open on a raw connection, even when
// ctx is done, but bounded: a black-holed connection must not hold the
// caller (or a whole group) forever. driver.ErrBadConn, returned from
// sql.Conn.Raw, discards a connection whose state is unknown.
func rollbackOn(ctx context.Context, ex driver.ExecerContext) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := ex.ExecContext(rctx, "ROLLBACK", nil); err != nil {
		return driver.ErrBadConn
	}
	return nil
}
