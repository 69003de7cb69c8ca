// Package account keeps balances and the account flow, the ledger whose
// UNIQUE(biz_no, type) index is the last wall against a double charge.
package account

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// Flow types.
const (
	TypePayDeduct     = "PAY_DEDUCT"
	TypeReverseDeduct = "REVERSE_DEDUCT"
)

var (
	// ErrDuplicateFlow: a flow of this type is already booked for the biz_no.
	// The payment was applied before: a duplicate, roll back and ack.
	ErrDuplicateFlow = errors.New("account: flow already booked")
	// ErrInsufficientBalance: the balance does not cover the amount. Retryable:
	// the account may be topped up.
	ErrInsufficientBalance = errors.New("account: balance not enough")
	// ErrNoAccount: the user has no account row yet. Retryable.
	ErrNoAccount = errors.New("account: not found")
)

// Deduct books a PAY_DEDUCT flow of -amount for bizNo and takes amount from
// the user's balance, only if the balance covers it. It must run inside the
// caller's transaction: on any error the caller rolls back, since the flow
// row may already be inserted.
func Deduct(ctx context.Context, tx interface {
	sqlx.ExecerContext
	sqlx.QueryerContext
}, userID int64, amount money.Cents, bizNo string) error {
	_, err := tx.ExecContext(ctx,
		`INSERT INTO t_account_flow (user_id, amount, biz_no, type, remark)
		 VALUES (?, CAST(? AS DECIMAL(18,2)), ?, ?, ?)`,
		userID, -amount, bizNo, TypePayDeduct, "payment "+bizNo)
	if sqldb.IsDuplicateKey(err) {
		return fmt.Errorf("deduct %s: %w", bizNo, ErrDuplicateFlow)
	}
	if err != nil {
		return fmt.Errorf("deduct %s: insert flow: %w", bizNo, err)
	}
	// CAST keeps the arithmetic in DECIMAL: a string parameter would make
	// MySQL compare and subtract in double precision.
	res, err := tx.ExecContext(ctx,
		`UPDATE t_account SET balance = balance - CAST(? AS DECIMAL(18,2))
		 WHERE user_id = ? AND balance >= CAST(? AS DECIMAL(18,2))`,
		amount, userID, amount)
	if err != nil {
		return fmt.Errorf("deduct %s: update balance: %w", bizNo, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("deduct %s: %w", bizNo, err)
	} else if n == 1 {
		return nil
	}
	var exists int
	err = sqlx.GetContext(ctx, tx, &exists, "SELECT COUNT(*) FROM t_account WHERE user_id = ?", userID)
	switch {
	case err != nil:
		return fmt.Errorf("deduct %s: read account: %w", bizNo, err)
	case exists == 0:
		return fmt.Errorf("deduct %s: user %d: %w", bizNo, userID, ErrNoAccount)
	default:
		return fmt.Errorf("deduct %s: user %d, amount %s: %w", bizNo, userID, amount, ErrInsufficientBalance)
	}
}

// Balance reads a user's balance (ErrNoAccount if there is no account).
func Balance(ctx context.Context, q sqlx.QueryerContext, userID int64) (money.Cents, error) {
	var b money.Cents
	err := sqlx.GetContext(ctx, q, &b, "SELECT balance FROM t_account WHERE user_id = ?", userID)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("balance of %d: %w", userID, ErrNoAccount)
	}
	return b, err
}

// Credit books a flow of +amount of the given type for bizNo and adds amount
// to the user's balance, inside the caller's transaction. A flow already
// booked for (bizNo, type) is ErrDuplicateFlow.
func Credit(ctx context.Context, tx sqlx.ExecerContext, userID int64, amount money.Cents, bizNo, flowType, remark string) error {
	_, err := tx.ExecContext(ctx,
		`INSERT INTO t_account_flow (user_id, amount, biz_no, type, remark) VALUES (?, CAST(? AS DECIMAL(18,2)), ?, ?, ?)`,
		userID, amount, bizNo, flowType, remark)
	if sqldb.IsDuplicateKey(err) {
		return fmt.Errorf("credit %s: %w", bizNo, ErrDuplicateFlow)
	}
	if err != nil {
		return fmt.Errorf("credit %s: insert flow: %w", bizNo, err)
	}
	res, err := tx.ExecContext(ctx, `UPDATE t_account SET balance = balance + CAST(? AS DECIMAL(18,2)) WHERE user_id = ?`, amount, userID)
	if err != nil {
		return fmt.Errorf("credit %s: update balance: %w", bizNo, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("credit %s: user %d: %w", bizNo, userID, ErrNoAccount)
	}
	return nil
}
