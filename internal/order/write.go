package order

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/fault"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// This file is the one place paysvc writes a payment. A set of payments
// (one alone, or a group) is four statements whatever its size, sent with
// START TRANSACTION in one round trip:
//
//  1. the INIT→PAID CAS of every order, each guarded by its own user and
//     amount;
//  2. one PAY_DEDUCT flow per payment (UNIQUE(biz_no, type): a second flow
//     for an order is a duplicate key error, and the set is rolled back);
//  3. each user's balance less the sum of that user's payments, only where
//     the balance covers the sum;
//  4. one notice per payment in the outbox.
//
// The set commits only if every statement changed exactly the rows it must
// (n orders, n flows, one account per user, n notices). Each order number
// occurs once in a set, so n orders changed means each payment's own CAS
// changed its own row; n flows, each payment's own flow; an account per
// user, each user's whole sum. Anything else is rolled back, and nothing of
// the set is applied.

// setWrite is the statement text and parameters that apply ps (sorted, no
// order number twice) and the counts each statement must report.
type setWrite struct {
	query string
	args  []driver.NamedValue
	want  []int64 // START TRANSACTION, then the four statements
}

func newSetWrite(ps []Payment, now time.Time, noticeLease time.Duration) setWrite {
	var q strings.Builder
	args := make([]driver.NamedValue, 0, 12*len(ps))
	arg := func(v any) {
		args = append(args, driver.NamedValue{Ordinal: len(args) + 1, Value: v})
	}
	list := func(n int, item string, each func(i int)) {
		for i := range n {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString(item)
			each(i)
		}
	}
	type sum struct {
		user  int64
		total money.Cents
	}
	var sums []sum // ps is sorted by user: one entry per run of a user
	for _, p := range ps {
		if k := len(sums) - 1; k >= 0 && sums[k].user == p.UserID {
			sums[k].total += p.Amount
		} else {
			sums = append(sums, sum{p.UserID, p.Amount})
		}
	}

	q.WriteString("START TRANSACTION;\nUPDATE t_order SET status = 'PAID', pay_time = CURRENT_TIMESTAMP(3)\n WHERE order_no IN (")
	list(len(ps), "?", func(i int) { arg(ps[i].OrderNo) })
	q.WriteString(") AND status = 'INIT'\n AND (order_no, user_id, amount) IN (")
	list(len(ps), "(?, ?, CAST(? AS DECIMAL(18,2)))", func(i int) {
		arg(ps[i].OrderNo)
		arg(ps[i].UserID)
		arg(ps[i].Amount.String())
	})
	q.WriteString(");\nINSERT INTO t_account_flow (user_id, amount, biz_no, type, remark) VALUES ")
	list(len(ps), "(?, CAST(? AS DECIMAL(18,2)), ?, 'PAY_DEDUCT', ?)", func(i int) {
		arg(ps[i].UserID)
		arg((-ps[i].Amount).String())
		arg(ps[i].OrderNo)
		arg("payment " + ps[i].OrderNo)
	})
	// CAST keeps the arithmetic in DECIMAL: a string would make the server
	// compare and subtract in double precision.
	cases := func() {
		q.WriteString("CASE user_id")
		for _, s := range sums {
			q.WriteString(" WHEN ? THEN CAST(? AS DECIMAL(18,2))")
			arg(s.user)
			arg(s.total.String())
		}
		q.WriteString(" END")
	}
	q.WriteString(";\nUPDATE t_account SET balance = balance - ")
	cases()
	q.WriteString("\n WHERE user_id IN (")
	list(len(sums), "?", func(i int) { arg(sums[i].user) })
	q.WriteString(") AND balance >= ")
	cases()
	// With a notice lease the notices are born leased to this process,
	// which publishes them itself after the COMMIT (Store.NoticeLease).
	item := "(?, ?, ?, ?)"
	q.WriteString(";\nINSERT INTO t_outbox (event_type, biz_no, payload, traceparent")
	if noticeLease > 0 {
		q.WriteString(", attempts, next_attempt_at")
		item = fmt.Sprintf("(?, ?, ?, ?, 1, CURRENT_TIMESTAMP(3) + INTERVAL %d MICROSECOND)", noticeLease.Microseconds())
	}
	q.WriteString(") VALUES ")
	list(len(ps), item, func(i int) {
		arg(outbox.EventPaymentSucceeded)
		arg(ps[i].OrderNo)
		arg(string(outbox.PaymentSucceeded(ps[i].OrderNo, ps[i].UserID, ps[i].Amount, now)))
		arg(ps[i].Trace)
	})
	n := int64(len(ps))
	return setWrite{query: q.String(), args: args, want: []int64{0, n, n, int64(len(sums)), n}}
}

// sumsFit reports whether each user's sum of ps (sorted by user) fits
// DECIMAL(18,2). A set's balance statement deducts those sums; one that
// did not fit could wrap around in int64 and deduct less than the
// payments. Amounts are at most money.Max, so a running sum checked after
// each addition never overflows.
func sumsFit(ps []Payment) bool {
	var total money.Cents
	for i, p := range ps {
		if i == 0 || ps[i-1].UserID != p.UserID {
			total = 0
		}
		if p.Amount < 0 || p.Amount > money.Max {
			return false
		}
		if total += p.Amount; total > money.Max {
			return false
		}
	}
	return true
}

// lockOrder sorts payments by user, then order number: every set takes
// its rows in this order (orders, then accounts, each by key), so two sets
// cannot wait on each other in a cycle.
func lockOrder(a, b Payment) int {
	return cmp.Or(cmp.Compare(a.UserID, b.UserID), strings.Compare(a.OrderNo, b.OrderNo))
}

// paySet applies ps (sorted by lockOrder, no order number twice) in one
// transaction on a connection of its own. committed says whether the set
// was committed as a whole; it is false, with a nil error, when a statement
// changed other rows than it must (a paid, missing or mismatched order, a
// balance that does not cover a user's sum): then nothing was applied. On
// an error wrapping sqldb.ErrCommitUnknown the set may or may not be
// committed; on any other error nothing was. commitOK, if not nil, is asked
// just before COMMIT: false rolls the set back (errCut).
func (s *Store) paySet(ctx context.Context, ps []Payment, commitOK func() bool) (committed bool, err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return false, fmt.Errorf("connection: %w", err)
	}
	defer conn.Close()
	w := newSetWrite(ps, time.Now(), s.NoticeLease)
	var opErr error
	rawErr := conn.Raw(func(dc any) error {
		ex := dc.(driver.ExecerContext)
		res, err := ex.ExecContext(ctx, w.query, w.args)
		if err != nil {
			opErr = err
			return rollbackOn(ctx, ex)
		}
		counts := res.(mysql.Result).AllRowsAffected()
		if len(counts) != len(w.want) {
			opErr = fmt.Errorf("payment set: %d results, want %d", len(counts), len(w.want))
			return rollbackOn(ctx, ex)
		}
		if !slices.Equal(counts, w.want) {
			return rollbackOn(ctx, ex)
		}
		fault.Point("mid_transaction")
		if commitOK != nil && !commitOK() {
			opErr = errCut
			return rollbackOn(ctx, ex)
		}
		if _, err := ex.ExecContext(ctx, "COMMIT", nil); err != nil {
			opErr = fmt.Errorf("%w: %w", sqldb.ErrCommitUnknown, err)
			return driver.ErrBadConn
		}
		committed = true
		return nil
	})
	if committed && s.OnCommitted != nil {
		nos := make([]string, len(ps))
		for i, p := range ps {
			nos[i] = p.OrderNo
		}
		s.OnCommitted(nos)
	}
	switch {
	case opErr != nil:
		return errors.Is(opErr, sqldb.ErrCommitUnknown), opErr
	case rawErr != nil:
		return false, rawErr
	}
	return committed, nil
}

// payAlone applies p as a set of one and, when nothing was applied, reads
// why.
func (s *Store) payAlone(ctx context.Context, p Payment) error {
	committed, err := s.paySet(ctx, []Payment{p}, nil)
	switch {
	case sqldb.DuplicateKey(err) == "uk_biz_no_type":
		// A flow is booked already: paid before (check says how), or a
		// flow without its order's CAS, which only a legacy path leaves.
		if err := check(ctx, s.db, p); err != nil {
			return err
		}
		return fmt.Errorf("deduct %s: %w", p.OrderNo, account.ErrDuplicateFlow)
	case err != nil:
		return err
	case committed:
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

// payable returns the payments of ps (sorted by lockOrder) that a set
// could apply now, as far as a plain read can tell: the order is INIT with
// the payment's user and amount, and the user's balance covers the sum of
// that user's payments taken so far. The others are left for the single
// path, which says why each cannot be applied.
func (s *Store) payable(ctx context.Context, ps []Payment) ([]Payment, error) {
	nos := make([]any, len(ps))
	users := make([]any, len(ps))
	for i, p := range ps {
		nos[i], users[i] = p.OrderNo, p.UserID
	}
	var orders []struct {
		OrderNo string      `db:"order_no"`
		Status  Status      `db:"status"`
		UserID  int64       `db:"user_id"`
		Amount  money.Cents `db:"amount"`
	}
	if err := s.db.SelectContext(ctx, &orders, "SELECT order_no, status, user_id, amount FROM t_order WHERE order_no IN (?"+
		strings.Repeat(", ?", len(ps)-1)+")", nos...); err != nil {
		return nil, fmt.Errorf("read orders: %w", err)
	}
	var accounts []struct {
		UserID  int64       `db:"user_id"`
		Balance money.Cents `db:"balance"`
	}
	if err := s.db.SelectContext(ctx, &accounts, "SELECT user_id, balance FROM t_account WHERE user_id IN (?"+
		strings.Repeat(", ?", len(ps)-1)+")", users...); err != nil {
		return nil, fmt.Errorf("read accounts: %w", err)
	}
	type order struct {
		user   int64
		amount money.Cents
	}
	init := map[string]order{}
	for _, o := range orders {
		if o.Status == Init {
			init[o.OrderNo] = order{o.UserID, o.Amount}
		}
	}
	left := map[int64]money.Cents{}
	for _, a := range accounts {
		left[a.UserID] = a.Balance
	}
	var out []Payment
	for _, p := range ps {
		o, ok := init[p.OrderNo]
		if b, has := left[p.UserID]; ok && has && o == (order{p.UserID, p.Amount}) && b >= p.Amount {
			left[p.UserID] = b - p.Amount
			out = append(out, p)
		}
	}
	return out, nil
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
