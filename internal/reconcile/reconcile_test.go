package reconcile_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/reconcile"
	"github.com/paysvc/paysvc/internal/testenv"
)

func kinds(r reconcile.Report) map[string]int {
	n := map[string]int{}
	for _, p := range r.Problems {
		n[p.Kind]++
	}
	return n
}

// Legacy data from before the unique index: a payment booked three times, and
// the other inconsistencies reconcile reports.
func TestReconcileFindsAndReversesDuplicates(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ctx := context.Background()
	db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 40.00), (2, 100.00), (3, 100.00)")
	db.MustExec("INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (1, 100.00, '2020-01-01'), (2, 100.00, '2020-01-01')")
	db.MustExec(`INSERT INTO t_order (order_no, user_id, amount, status) VALUES
		('DUP', 1, 20.00, 'PAID'), ('NOFLOW', 2, 5.00, 'PAID'), ('MIS', 3, 7.00, 'PAID'), ('INIT1', 3, 1.00, 'INIT')`)
	db.MustExec(`INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES
		(1, -20.00, 'DUP', 'PAY_DEDUCT'), (1, -20.00, 'DUP', 'PAY_DEDUCT'), (1, -20.00, 'DUP', 'PAY_DEDUCT'),
		(3, -7.01, 'MIS', 'PAY_DEDUCT'), (3, -1.00, 'INIT1', 'PAY_DEDUCT'), (3, -2.00, 'GONE', 'PAY_DEDUCT')`)

	rep, err := reconcile.Run(ctx, db, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{reconcile.DuplicateFlow: 1, reconcile.PaidWithoutFlow: 1, reconcile.FlowMismatch: 1,
		reconcile.FlowWithoutPayment: 2, reconcile.BalanceMismatch: 0}
	got := kinds(rep)
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d, want %d (report %+v)", k, got[k], n, rep.Problems)
		}
	}
	// User 1: opening 100, three -20 flows → expected 40 = balance: consistent
	// before the fix (the duplicates really were charged).
	var before int
	db.Get(&before, "SELECT COUNT(*) FROM t_account_flow")

	rep, err = reconcile.Run(ctx, db, reconcile.Options{Fix: true})
	if err != nil {
		t.Fatal(err)
	}
	if k := kinds(rep); k[reconcile.DuplicateFlow] != 1 || !rep.Problems[0].Fixed {
		t.Fatalf("fix run: %+v", rep.Problems)
	}
	var bal, rev money.Cents
	db.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1")
	db.Get(&rev, "SELECT amount FROM t_account_flow WHERE biz_no = 'DUP-REVERSE' AND type = 'REVERSE_DEDUCT'")
	if bal != 8000 || rev != 4000 {
		t.Fatalf("after fix: balance %s, reversal %s; want 80.00 and +40.00", bal, rev)
	}
	var pay int
	db.Get(&pay, "SELECT COUNT(*) FROM t_account_flow WHERE biz_no = 'DUP' AND type = 'PAY_DEDUCT'")
	if pay != 3 {
		t.Fatalf("%d PAY_DEDUCT rows for DUP: the fix must not delete money rows", pay)
	}

	// Idempotent: a second fix books nothing and no longer reports the group.
	rep, err = reconcile.Run(ctx, db, reconcile.Options{Fix: true})
	if err != nil {
		t.Fatal(err)
	}
	var after int
	db.Get(&after, "SELECT COUNT(*) FROM t_account_flow")
	if after != before+1 || kinds(rep)[reconcile.DuplicateFlow] != 0 || rep.Reconciled != 1 || kinds(rep)[reconcile.BalanceMismatch] != 0 {
		t.Fatalf("second fix: %d flows (want %d), report %+v", after, before+1, rep)
	}
}

func TestReconcileBalanceMismatch(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 95.00)")
	db.MustExec("INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (1, 100.00, '2020-01-01')")
	db.MustExec("INSERT INTO t_order (order_no, user_id, amount, status) VALUES ('W1', 1, 3.00, 'PAID')")
	db.MustExec("INSERT INTO t_account_flow (user_id, amount, biz_no, type, create_time) VALUES (1, -3.00, 'W1', 'PAY_DEDUCT', '2026-01-01')")
	rep, err := reconcile.Run(context.Background(), db, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || rep.Problems[0].Kind != reconcile.BalanceMismatch {
		t.Fatalf("report %+v, want one balance mismatch (95.00 vs 97.00)", rep.Problems)
	}
}

// Two fixing runs at once (cron and an operator) on a legacy table with no
// unique key: each duplicate gets one reversal, not two.
func TestConcurrentFixesBookOneReversalEach(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ctx := context.Background()
	db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	const groups = 40
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 1000.00)")
	for i := range groups {
		no := fmt.Sprintf("CF%02d", i)
		db.MustExec("INSERT INTO t_order (order_no, user_id, amount, status) VALUES (?, 1, 1.00, 'PAID')", no)
		db.MustExec("INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES (1, -1.00, ?, 'PAY_DEDUCT'), (1, -1.00, ?, 'PAY_DEDUCT')", no, no)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { _, errs[i] = reconcile.Run(ctx, db, reconcile.Options{Fix: true}) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var reversals, most int
	db.Get(&reversals, "SELECT COUNT(*) FROM t_account_flow WHERE type = 'REVERSE_DEDUCT'")
	db.Get(&most, "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM t_account_flow WHERE type = 'REVERSE_DEDUCT' GROUP BY biz_no) x")
	var bal money.Cents
	db.Get(&bal, "SELECT balance FROM t_account WHERE user_id = 1")
	if reversals != groups || most != 1 || bal != 100000+groups*100 {
		t.Fatalf("%d reversals (at most %d for one order), balance %s; want %d, 1, %s", reversals, most, bal,
			groups, money.Cents(100000+groups*100))
	}
}

// Legacy duplicates that one fix cannot settle are reported for a person,
// and the run goes on: flows of one order naming two users (crediting one
// of them the other's charge would pay the wrong user), and a duplicate of
// a user with no account row (its credit is refused).
func TestReconcileLeavesWhatItCannotReverseToAPerson(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ctx := context.Background()
	db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (3, 100.00), (7, 90.00), (8, 50.00)")
	db.MustExec(`INSERT INTO t_order (order_no, user_id, amount, status) VALUES
		('MIXED', 7, 5.00, 'PAID'), ('NOACC', 9, 4.00, 'PAID'), ('ZDUP', 8, 10.00, 'PAID')`)
	db.MustExec(`INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES
		(7, -5.00, 'MIXED', 'PAY_DEDUCT'), (3, -5.00, 'MIXED', 'PAY_DEDUCT'), (7, -5.00, 'MIXED', 'PAY_DEDUCT'),
		(9, -4.00, 'NOACC', 'PAY_DEDUCT'), (9, -4.00, 'NOACC', 'PAY_DEDUCT'),
		(8, -10.00, 'ZDUP', 'PAY_DEDUCT'), (8, -10.00, 'ZDUP', 'PAY_DEDUCT'),
		(8, -1.00, 'TWICE', 'PAY_DEDUCT'), (8, -1.00, 'TWICE', 'PAY_DEDUCT'),
		(8, 1.00, 'TWICE-REVERSE', 'REVERSE_DEDUCT'), (8, 1.00, 'TWICE-REVERSE', 'REVERSE_DEDUCT'),
		(7, 20.00, 'PLUS', 'PAY_DEDUCT'), (7, 20.00, 'PLUS', 'PAY_DEDUCT'), (7, 20.00, 'PLUS', 'PAY_DEDUCT'),
		(3, -5.00, 'SIGNS', 'PAY_DEDUCT'), (3, 5.00, 'SIGNS', 'PAY_DEDUCT')`)
	db.MustExec(`INSERT INTO t_order (order_no, user_id, amount, status) VALUES ('TWICE', 8, 1.00, 'PAID'),
		('PLUS', 7, 20.00, 'PAID'), ('SIGNS', 3, 5.00, 'PAID')`)

	rep, err := reconcile.Run(ctx, db, reconcile.Options{Fix: true})
	if err != nil {
		t.Fatalf("fix run: %v (one group it cannot reverse must not stop the others)", err)
	}
	fixed := fixedGroups(rep)
	// PLUS (legacy flows stored positive) and SIGNS (a flow that is not a
	// charge) would be "reversed" by charging the user again.
	if want := map[string]bool{"MIXED": false, "NOACC": false, "ZDUP": true, "PLUS": false, "SIGNS": false}; fmt.Sprint(fixed) != fmt.Sprint(want) {
		t.Fatalf("duplicate groups fixed %v, want %v (report %+v)", fixed, want, rep.Problems)
	}
	untouchedButZDUP(t, db)
	var reversals int
	db.Get(&reversals, "SELECT COUNT(*) FROM t_account_flow WHERE type = 'REVERSE_DEDUCT'")
	if reversals != 3 {
		t.Fatalf("%d reversals, want 3 (ZDUP's, and the two TWICE had)", reversals)
	}
	if k := kinds(rep); k[reconcile.PartiallyReversed] != 1 {
		t.Fatalf("TWICE with two reversals not reported for a person: %+v", rep.Problems)
	}
}

// A run limited to a window judges each order it finds on all the order's
// flows: a flow of another user before the window still makes the group
// one for a person, not a refund to the user the window shows. A reversal
// the table refuses (its biz_no too long) is left for a person too, and
// the run goes on to the next group.
func TestReconcileWindowJudgesWholeOrders(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ctx := context.Background()
	db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (3, 100.00), (7, 90.00), (8, 50.00)")
	long := strings.Repeat("L", 75) // with -REVERSE, longer than biz_no's 80
	db.MustExec(`INSERT INTO t_account_flow (user_id, amount, biz_no, type, create_time) VALUES
		(3, -5.00, 'MIXED', 'PAY_DEDUCT', '2026-01-01'), (7, -5.00, 'MIXED', 'PAY_DEDUCT', '2026-02-01'),
		(7, -5.00, 'MIXED', 'PAY_DEDUCT', '2026-02-01'),
		(8, -2.00, ?, 'PAY_DEDUCT', '2026-02-01'), (8, -2.00, ?, 'PAY_DEDUCT', '2026-02-01'),
		(8, -10.00, 'ZDUP', 'PAY_DEDUCT', '2026-02-01'), (8, -10.00, 'ZDUP', 'PAY_DEDUCT', '2026-02-01')`, long, long)

	rep, err := reconcile.Run(ctx, db, reconcile.Options{Fix: true, From: time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		t.Fatalf("fix run: %v (a reversal the table refuses must not stop the others)", err)
	}
	fixed := fixedGroups(rep)
	if want := map[string]bool{"MIXED": false, long: false, "ZDUP": true}; fmt.Sprint(fixed) != fmt.Sprint(want) {
		t.Fatalf("duplicate groups fixed %v, want %v (report %+v)", fixed, want, rep.Problems)
	}
	untouchedButZDUP(t, db)
}

// fixedGroups is whether each duplicate group of rep was fixed, by biz_no.
func fixedGroups(rep reconcile.Report) map[string]bool {
	fixed := map[string]bool{}
	for _, p := range rep.Problems {
		if p.Kind == reconcile.DuplicateFlow {
			fixed[p.BizNo] = p.Fixed
		}
	}
	return fixed
}

// untouchedButZDUP checks the balances of users 3, 7 and 8 after a fixing
// run that must leave 3's and 7's alone and reverse user 8's ZDUP (10.00).
func untouchedButZDUP(t *testing.T, db *sqlx.DB) {
	t.Helper()
	var b3, b7, b8 money.Cents
	db.Get(&b3, "SELECT balance FROM t_account WHERE user_id = 3")
	db.Get(&b7, "SELECT balance FROM t_account WHERE user_id = 7")
	db.Get(&b8, "SELECT balance FROM t_account WHERE user_id = 8")
	if b3 != 10000 || b7 != 9000 || b8 != 6000 {
		t.Fatalf("balances 3: %s, 7: %s, 8: %s; want 100.00 and 90.00 untouched, 60.00 after ZDUP's reversal", b3, b7, b8)
	}
}

// One legacy order fails several checks, and each finding is reported, but
// the order counts once: three flows of a missing order, an INIT order with
// a flow of another amount (paid without its CAS), a PAID order charged
// twice at a wrong amount. An account whose balance disagrees counts apart.
func TestReconcileCountsEachOrderOnce(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.MustExec("ALTER TABLE t_account_flow DROP INDEX uk_biz_no_type")
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 50.00), (2, 100.00)")
	db.MustExec("INSERT INTO t_account_opening (user_id, balance, as_of) VALUES (1, 60.00, '2020-01-01')")
	db.MustExec(`INSERT INTO t_order (order_no, user_id, amount, status) VALUES
		('NOCAS', 2, 5.00, 'INIT'), ('MISDUP', 2, 7.00, 'PAID'), ('NOFLOW', 2, 3.00, 'PAID')`)
	db.MustExec(`INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES
		(2, -2.00, 'GONE', 'PAY_DEDUCT'), (2, -2.00, 'GONE', 'PAY_DEDUCT'), (2, -2.00, 'GONE', 'PAY_DEDUCT'),
		(2, -6.00, 'NOCAS', 'PAY_DEDUCT'),
		(2, -7.01, 'MISDUP', 'PAY_DEDUCT'), (2, -7.01, 'MISDUP', 'PAY_DEDUCT')`)

	rep, err := reconcile.Run(context.Background(), db, reconcile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, p := range rep.Problems {
		got[p.Kind+" "+p.BizNo]++
	}
	want := map[string]int{
		"duplicate_flow GONE": 1, "flow_without_payment GONE": 3,
		"flow_without_payment NOCAS": 1, "flow_mismatch NOCAS": 1,
		"duplicate_flow MISDUP": 1, "flow_mismatch MISDUP": 2,
		"paid_without_flow NOFLOW": 1,
		"balance_mismatch ":        1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("findings %v, want %v (every finding about each order)", got, want)
	}
	if rep.Orders() != 4 || rep.Accounts() != 1 {
		t.Fatalf("%d findings counted as %d orders and %d accounts, want 4 orders (GONE, NOCAS, MISDUP, NOFLOW) and 1 account",
			len(rep.Problems), rep.Orders(), rep.Accounts())
	}
}
