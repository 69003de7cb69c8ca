// Package reconcile checks money rows against each other and reverses
// duplicate charges. It never deletes or updates a money row: a fix is a new
// REVERSE_DEDUCT flow, with the balance given back, in one transaction; a
// second run finds the reversal and books nothing new.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/sqldb"
)

// Kinds of problem.
const (
	DuplicateFlow      = "duplicate_flow"       // PAY_DEDUCT booked more than once for one biz_no
	PartiallyReversed  = "partially_reversed"   // a reversal exists but does not cover every duplicate
	PaidWithoutFlow    = "paid_without_flow"    // order PAID/SETTLED, no PAY_DEDUCT flow
	FlowWithoutPayment = "flow_without_payment" // PAY_DEDUCT flow, order missing or INIT
	FlowMismatch       = "flow_mismatch"        // flow user or amount differ from the order's
	BalanceMismatch    = "balance_mismatch"     // balance != opening balance + flows since
)

// Problem is one finding.
type Problem struct {
	Kind   string
	BizNo  string
	UserID int64
	Detail string
	Fixed  bool        // a reversal was booked, or a lost payment re-driven, by this run
	Amount money.Cents // lost_payment: the payment's amount
}

// Report is what a run found.
type Report struct {
	Problems   []Problem // every finding: one order may fail several checks
	Reconciled int       // duplicate groups already reversed by an earlier run
	Lost       []Lost    // the lost payments among Problems, by order number
}

// Orders is how many orders the findings are about, each once however many
// findings it has: the checks overlap on legacy data (duplicate flows of a
// missing order are a duplicate_flow and a flow_without_payment per flow; a
// flow of the wrong amount on an INIT order, flow_without_payment and
// flow_mismatch).
func (r Report) Orders() int {
	orders := map[string]bool{}
	for _, p := range r.Problems {
		if p.Kind != BalanceMismatch {
			orders[p.BizNo] = true
		}
	}
	return len(orders)
}

// Accounts is how many accounts' balances disagree with their opening
// balance and flows (one finding each).
func (r Report) Accounts() int {
	n := 0
	for _, p := range r.Problems {
		if p.Kind == BalanceMismatch {
			n++
		}
	}
	return n
}

// Options bound a run.
type Options struct {
	From, To time.Time // flows and payments in [From, To); zero: unbounded
	Fix      bool      // book reversals for duplicate flows
	// The lost-payment check, over every done key and every notice
	// whatever From and To (nil: not run). Its fix, a re-drive through the
	// main queue, is the caller's (replay.Replayer.Redrive).
	Done     DoneKeys  // the Redis guard's done keys
	ScanRate int       // keys read a second from Done (0: no bound)
	Notices  io.Reader // payment-success notices, one JSON body a line
}

// ReverseSuffix makes the biz_no of a reversal: <orig>-REVERSE.
const ReverseSuffix = "-REVERSE"

// fixLease is the lease a fixing run holds: two runs at once (cron and an
// operator, two replicas' schedules) must not both find a duplicate
// unreversed and book two reversals. The unique key on (biz_no, type)
// refuses the second one too, but a legacy table that predates it (the
// very case reconcile fixes) has none. A lease row rather than GET_LOCK:
// on a Galera cluster two runs on two nodes would both be granted the
// named lock.
const fixLease = "paysvc.reconcile.fix"

// fixLeaseWait bounds the wait for another fixing run to finish.
const fixLeaseWait = 60 * time.Second

// ErrFixRunning: another fixing run held the lease for fixLeaseWait.
var ErrFixRunning = errors.New("reconcile: another run with --fix holds the lease " + fixLease)

// Run checks everything and, with Fix, reverses duplicate flows. A fixing
// run holds a lease for its whole duration, so concurrent fixing runs take
// turns and the second finds the first one's reversals; a run that loses
// its lease stops there (its context ends).
func Run(ctx context.Context, db *sqlx.DB, o Options) (Report, error) {
	var r Report
	if o.Fix {
		held, release, err := sqldb.Lease(ctx, db, fixLease, fixLeaseWait)
		if errors.Is(err, sqldb.ErrLocked) {
			return r, ErrFixRunning
		}
		if err != nil {
			return r, fmt.Errorf("reconcile: lease: %w", err)
		}
		defer release()
		ctx = held
	}
	if err := duplicates(ctx, db, o, &r); err != nil {
		return r, err
	}
	steps := []func(context.Context, *sqlx.DB, Options, *Report) error{paidWithoutFlow, flowWithoutPayment, flowMismatch, balances, lost}
	for _, step := range steps {
		if err := step(ctx, db, o, &r); err != nil {
			return r, err
		}
	}
	return r, nil
}

func window(col string, o Options) (string, []any) {
	q, args := "", []any{}
	if !o.From.IsZero() {
		q += " AND " + col + " >= ?"
		args = append(args, o.From.UTC())
	}
	if !o.To.IsZero() {
		q += " AND " + col + " < ?"
		args = append(args, o.To.UTC())
	}
	return q, args
}

func duplicates(ctx context.Context, db *sqlx.DB, o Options, r *Report) error {
	w, args := window("create_time", o)
	var groups []struct {
		BizNo   string `db:"biz_no"`
		UserID  int64  `db:"user_id"`
		Users   int    `db:"users"`
		N       int    `db:"n"`
		FirstID int64  `db:"first_id"`
		// The largest: a charge is negative, and a flow that is not one
		// (a legacy row stored positive) leaves the group to a person.
		MaxAmount money.Cents `db:"max_amount"`
	}
	// The window picks the orders (a flow of theirs in it); each order is
	// then judged on all its flows: its users and its extra charges alike,
	// or a window that leaves another user's flow out would credit its
	// amount to the wrong user.
	err := db.SelectContext(ctx, &groups, `SELECT biz_no, MIN(user_id) AS user_id, COUNT(DISTINCT user_id) AS users,
		COUNT(*) AS n, MIN(id) AS first_id, MAX(amount) AS max_amount
		FROM t_account_flow WHERE type = 'PAY_DEDUCT'
		  AND biz_no IN (SELECT biz_no FROM t_account_flow WHERE type = 'PAY_DEDUCT'`+w+`)
		GROUP BY biz_no HAVING COUNT(*) > 1 ORDER BY biz_no`, args...)
	if err != nil {
		return fmt.Errorf("reconcile: duplicates: %w", err)
	}
	for _, g := range groups {
		// Every flow but the first is extra; its (negative) amounts summed.
		var extra money.Cents
		if err := db.GetContext(ctx, &extra, `SELECT COALESCE(SUM(amount), 0) FROM t_account_flow
			WHERE biz_no = ? AND type = 'PAY_DEDUCT' AND id <> ?`, g.BizNo, g.FirstID); err != nil {
			return err
		}
		refund := -extra
		var reversed []money.Cents
		if err := db.SelectContext(ctx, &reversed, `SELECT amount FROM t_account_flow WHERE biz_no = ? AND type = ?`,
			g.BizNo+ReverseSuffix, account.TypeReverseDeduct); err != nil {
			return err
		}
		p := Problem{Kind: DuplicateFlow, BizNo: g.BizNo, UserID: g.UserID,
			Detail: fmt.Sprintf("%d PAY_DEDUCT flows; %s charged twice or more", g.N, refund)}
		switch {
		case g.Users > 1:
			// Which user was charged in excess is not the data's to say:
			// crediting one user the others' flows would pay the wrong one.
			p.Detail += fmt.Sprintf("; the flows name %d users: fix by hand", g.Users)
		case g.MaxAmount >= 0:
			// Not every flow is a charge (a legacy row stored positive):
			// the "reversal" of such extras would charge the user again.
			p.Detail += fmt.Sprintf("; a PAY_DEDUCT flow of %s is not a charge: fix by hand", g.MaxAmount)
		case len(reversed) == 1 && reversed[0] == refund:
			r.Reconciled++
			continue
		case len(reversed) == 1:
			p.Kind = PartiallyReversed
			p.Detail += fmt.Sprintf("; reversal %s books %s: fix by hand", g.BizNo+ReverseSuffix, reversed[0])
		case len(reversed) > 1:
			// Only a table without uk_biz_no_type, and a hand, can hold two:
			// booking a third would only add to them.
			p.Kind = PartiallyReversed
			p.Detail += fmt.Sprintf("; %d reversals %s exist: fix by hand", len(reversed), g.BizNo+ReverseSuffix)
		case o.Fix:
			err := reverse(ctx, db, g.UserID, refund, g.BizNo)
			switch {
			case errors.Is(err, account.ErrNoAccount):
				// This group cannot be reversed; the others and the
				// remaining checks still run.
				p.Detail += fmt.Sprintf("; not reversed: user %d has no account: fix by hand", g.UserID)
			case sqldb.IsDataRejected(err):
				// The table refuses this reversal's row (an order number
				// too long for its -REVERSE biz_no): the same, for a person.
				p.Detail += fmt.Sprintf("; not reversed: %v: fix by hand", err)
			case err != nil:
				return err
			default:
				p.Fixed = true
				p.Detail += fmt.Sprintf("; reversed by %s (+%s)", g.BizNo+ReverseSuffix, refund)
			}
		}
		r.Problems = append(r.Problems, p)
	}
	return nil
}

// reverse books one REVERSE_DEDUCT flow and gives the amount back, in one
// transaction. A reversal that already exists (another run got there first)
// is not an error.
func reverse(ctx context.Context, db *sqlx.DB, userID int64, refund money.Cents, bizNo string) error {
	err := sqldb.InTx(ctx, db, func(tx *sqldb.Tx) error {
		return account.Credit(ctx, tx, userID, refund, bizNo+ReverseSuffix, account.TypeReverseDeduct,
			"reversal of duplicate PAY_DEDUCT "+bizNo)
	})
	if errors.Is(err, account.ErrDuplicateFlow) {
		return nil
	}
	return err
}

func paidWithoutFlow(ctx context.Context, db *sqlx.DB, o Options, r *Report) error {
	w, args := window("o.pay_time", o)
	var rows []struct {
		OrderNo string `db:"order_no"`
		UserID  int64  `db:"user_id"`
		Status  string `db:"status"`
	}
	err := db.SelectContext(ctx, &rows, `SELECT o.order_no, o.user_id, o.status FROM t_order o
		WHERE o.status IN ('PAID', 'SETTLED')`+w+`
		  AND NOT EXISTS (SELECT 1 FROM t_account_flow f WHERE f.biz_no = o.order_no AND f.type = 'PAY_DEDUCT')
		ORDER BY o.order_no`, args...)
	for _, x := range rows {
		r.Problems = append(r.Problems, Problem{Kind: PaidWithoutFlow, BizNo: x.OrderNo, UserID: x.UserID,
			Detail: "order is " + x.Status + " but no PAY_DEDUCT flow exists"})
	}
	return err
}

func flowWithoutPayment(ctx context.Context, db *sqlx.DB, o Options, r *Report) error {
	w, args := window("f.create_time", o)
	var rows []struct {
		BizNo  string      `db:"biz_no"`
		UserID int64       `db:"user_id"`
		Amount money.Cents `db:"amount"`
		Status *string     `db:"status"`
	}
	err := db.SelectContext(ctx, &rows, `SELECT f.biz_no, f.user_id, f.amount, o.status FROM t_account_flow f
		LEFT JOIN t_order o ON o.order_no = f.biz_no
		WHERE f.type = 'PAY_DEDUCT' AND (o.order_no IS NULL OR o.status = 'INIT')`+w+` ORDER BY f.id`, args...)
	for _, x := range rows {
		why := "order missing"
		if x.Status != nil {
			why = "order is " + *x.Status
		}
		r.Problems = append(r.Problems, Problem{Kind: FlowWithoutPayment, BizNo: x.BizNo, UserID: x.UserID,
			Detail: fmt.Sprintf("PAY_DEDUCT %s, %s", x.Amount, why)})
	}
	return err
}

func flowMismatch(ctx context.Context, db *sqlx.DB, o Options, r *Report) error {
	w, args := window("f.create_time", o)
	var rows []struct {
		BizNo      string      `db:"biz_no"`
		FlowUser   int64       `db:"flow_user"`
		FlowAmount money.Cents `db:"flow_amount"`
		OrderUser  int64       `db:"order_user"`
		OrderAmt   money.Cents `db:"order_amount"`
	}
	err := db.SelectContext(ctx, &rows, `SELECT f.biz_no, f.user_id AS flow_user, f.amount AS flow_amount,
		o.user_id AS order_user, o.amount AS order_amount
		FROM t_account_flow f JOIN t_order o ON o.order_no = f.biz_no
		WHERE f.type = 'PAY_DEDUCT' AND (f.user_id <> o.user_id OR -f.amount <> o.amount)`+w+` ORDER BY f.id`, args...)
	for _, x := range rows {
		r.Problems = append(r.Problems, Problem{Kind: FlowMismatch, BizNo: x.BizNo, UserID: x.FlowUser,
			Detail: fmt.Sprintf("flow user %d amount %s; order user %d amount %s", x.FlowUser, x.FlowAmount, x.OrderUser, x.OrderAmt)})
	}
	return err
}

func balances(ctx context.Context, db *sqlx.DB, _ Options, r *Report) error {
	var rows []struct {
		UserID   int64       `db:"user_id"`
		Balance  money.Cents `db:"balance"`
		Expected money.Cents `db:"expected"`
	}
	err := db.SelectContext(ctx, &rows, `SELECT a.user_id, a.balance,
		ob.balance + COALESCE((SELECT SUM(f.amount) FROM t_account_flow f
			WHERE f.user_id = ob.user_id AND f.create_time >= ob.as_of), 0) AS expected
		FROM t_account_opening ob JOIN t_account a ON a.user_id = ob.user_id
		ORDER BY a.user_id`)
	for _, x := range rows {
		if x.Balance != x.Expected {
			r.Problems = append(r.Problems, Problem{Kind: BalanceMismatch, UserID: x.UserID,
				Detail: fmt.Sprintf("balance %s, opening balance plus flows %s (difference %s)", x.Balance, x.Expected, x.Balance-x.Expected)})
		}
	}
	return err
}
