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
