package order

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
)

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

// payChained applies p as a group of one (payGroup: the chain, then COMMIT,
// on a connection of its own) and, when nothing was applied, reads why.
func (s *Store) payChained(ctx context.Context, p Payment) error {
	applied, err := s.payGroup(ctx, []Payment{p})
	var me *mysql.MySQLError
	switch {
	case err != nil && sqldb.IsDuplicateKey(err) && errors.As(err, &me) && strings.Contains(me.Message, "uk_biz_no_type"):
		return fmt.Errorf("deduct %s: %w", p.OrderNo, account.ErrDuplicateFlow)
	case err != nil:
		return err
	case applied[0]:
		return nil
	}
	// Nothing changed. The connection is back in the pool: holding it while
	// taking another from a bounded pool could deadlock the pool.
	if err := check(ctx, s.db, p); err != nil {
		return err // paid, missing, mismatched, not payable
	}
	var balance money.Cents
	err = s.db.GetContext(ctx, &balance, "SELECT balance FROM t_account WHERE user_id = ?", p.UserID)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("deduct %s: user %d: %w", p.OrderNo, p.UserID, account.ErrNoAccount)
	case err != nil:
		return fmt.Errorf("read account: %w", err)
	case balance < p.Amount:
		return fmt.Errorf("deduct %s: user %d, amount %s: %w", p.OrderNo, p.UserID, p.Amount, account.ErrInsufficientBalance)
	}
	return errors.New("payment changed nothing, yet the order and the account allow it: they changed meanwhile")
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
