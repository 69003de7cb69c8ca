package main

import (
	"context"
	"fmt"
	"time"

	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// plainPay is the payment transaction's body as a plain Go program writes
// it, one statement per round trip inside the caller's transaction: the
// INIT→PAID CAS, the flow, the conditional balance update, the notice. The
// ceilings measure the database with it; paysvc itself writes payments only
// through order.Store (internal/order/write.go).
func plainPay(ctx context.Context, tx *sqldb.Tx, p order.Payment) error {
	amount := p.Amount.String()
	steps := []struct {
		what  string
		query string
		args  []any
	}{
		{"mark paid", `UPDATE t_order SET status = 'PAID', pay_time = CURRENT_TIMESTAMP(3)
			WHERE order_no = ? AND status = 'INIT' AND user_id = ? AND amount = CAST(? AS DECIMAL(18,2))`,
			[]any{p.OrderNo, p.UserID, amount}},
		{"insert flow", `INSERT INTO t_account_flow (user_id, amount, biz_no, type, remark)
			VALUES (?, CAST(? AS DECIMAL(18,2)), ?, 'PAY_DEDUCT', ?)`,
			[]any{p.UserID, (-p.Amount).String(), p.OrderNo, "payment " + p.OrderNo}},
		{"update balance", `UPDATE t_account SET balance = balance - CAST(? AS DECIMAL(18,2))
			WHERE user_id = ? AND balance >= CAST(? AS DECIMAL(18,2))`,
			[]any{amount, p.UserID, amount}},
		{"insert notice", "INSERT INTO t_outbox (event_type, biz_no, payload) VALUES (?, ?, ?)",
			[]any{outbox.EventPaymentSucceeded, p.OrderNo, outbox.PaymentSucceeded(p.OrderNo, p.UserID, p.Amount, time.Now())}},
	}
	for _, s := range steps {
		res, err := tx.ExecContext(ctx, s.query, s.args...)
		if err != nil {
			return fmt.Errorf("%s %s: %w", p.OrderNo, s.what, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("%s %s: %d rows changed (%v)", p.OrderNo, s.what, n, err)
		}
	}
	return nil
}
