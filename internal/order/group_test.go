package order_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/account"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// mixedGroup seeds one order per case a group meets and returns the
// payments, in an order that is not the group's lock order.
func mixedGroup(t *testing.T, db *sqlx.DB) []order.Payment {
	seed(t, db, "G1", 1, "10.00", "100.00")
	seed(t, db, "G2", 2, "5.00", "100.00") // the message says 6.00: mismatch
	seed(t, db, "G3", 3, "5.00", "1.00")   // not enough balance
	seed(t, db, "G4", 1, "20.00", "100.00")
	db.MustExec("UPDATE t_account SET balance = 100.00 WHERE user_id = 1")
	seed(t, db, "G6", 4, "3.00", "100.00")
	db.MustExec("UPDATE t_order SET status = 'PAID' WHERE order_no = 'G6'") // already paid
	return []order.Payment{
		pay("G4", 1, 2000), pay("G3", 3, 500), pay("G1", 1, 1000),
		pay("G2", 2, 600), pay("G5", 5, 100) /* no such order */, pay("G6", 4, 300),
	}
}

func outboxRows(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	if err := db.Get(&n, "SELECT COUNT(*) FROM t_outbox"); err != nil {
		t.Fatal(err)
	}
	return n
}

// A group commits exactly the payments whose every statement changed one
// row, and leaves the rest untouched: a mismatch, a missing or paid order
// (the CAS changes nothing), and a payment the balance cannot cover (CAS and
// flow done, balance refused: the group is rolled back and run without it).
func TestPayGroupCommitsOnlyWholePayments(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ps := mixedGroup(t, db)
	applied, err := order.PayGroup(order.NewStore(db), context.Background(), ps)
	if err != nil {
		t.Fatalf("payGroup: %v", err)
	}
	if want := []bool{true, false, true, false, false, false}; !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v (G4 G3 G1 G2 G5 G6)", applied, want)
	}
	for _, c := range []struct {
		no   string
		user int64
		want state
	}{
		{"G1", 1, state{order.Paid, 7000, 1, -1000}},
		{"G4", 1, state{order.Paid, 7000, 1, -2000}},
		{"G2", 2, state{order.Init, 10000, 0, 0}},
		{"G3", 3, state{order.Init, 100, 0, 0}},
		{"G6", 4, state{order.Paid, 10000, 0, 0}},
	} {
		if got := read(t, db, c.no, c.user); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.no, got, c.want)
		}
	}
	if n := outboxRows(t, db); n != 2 {
		t.Errorf("%d notices in the outbox, want 2", n)
	}
}

// A group takes each user's payments as one sum: a balance that covers
// each payment alone but not their sum commits the ones it covers, in lock
// order, and leaves the rest for the single path.
func TestPayGroupDeductsEachUsersSum(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seed(t, db, "H1", 1, "10.00", "25.00")
	seed(t, db, "H2", 1, "20.00", "25.00")
	seed(t, db, "H3", 2, "5.00", "5.00")
	store := order.NewStore(db)
	applied, err := order.PayGroup(store, context.Background(), []order.Payment{pay("H2", 1, 2000), pay("H3", 2, 500), pay("H1", 1, 1000)})
	if err != nil {
		t.Fatalf("payGroup: %v", err)
	}
	if want := []bool{false, true, true}; !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v (H2 H3 H1)", applied, want)
	}
	if got, want := read(t, db, "H1", 1), (state{order.Paid, 1500, 1, -1000}); got != want {
		t.Errorf("H1: %+v, want %+v", got, want)
	}
	if got, want := read(t, db, "H3", 2), (state{order.Paid, 0, 1, -500}); got != want {
		t.Errorf("H3: %+v, want %+v", got, want)
	}
	if err := store.Pay(context.Background(), pay("H2", 1, 2000)); !errors.Is(err, account.ErrInsufficientBalance) {
		t.Errorf("H2 alone: %v, want ErrInsufficientBalance", err)
	}
	if got, want := read(t, db, "H2", 1), (state{order.Init, 1500, 0, 0}); got != want {
		t.Errorf("H2: %+v, want %+v", got, want)
	}
}

// An error in the middle of a group (a flow already there for an unpaid
// order, as a legacy path could leave it) rolls the whole group back: the
// other payment is not applied either, and nothing says it was.
func TestPayGroupErrorChangesNothing(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seed(t, db, "E1", 1, "1.00", "10.00")
	seed(t, db, "E2", 2, "2.00", "10.00")
	db.MustExec("INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES (2, -2.00, 'E2', 'PAY_DEDUCT')")
	applied, err := order.PayGroup(order.NewStore(db), context.Background(),
		[]order.Payment{pay("E1", 1, 100), pay("E2", 2, 200)})
	if err == nil || !sqldb.IsDuplicateKey(err) {
		t.Fatalf("payGroup = %v, want the duplicate key error", err)
	}
	if slices.Contains(applied, true) {
		t.Fatalf("applied %v after an error", applied)
	}
	if got, want := read(t, db, "E1", 1), (state{order.Init, 1000, 0, 0}); got != want {
		t.Fatalf("E1: %+v, want %+v", got, want)
	}
	if n := outboxRows(t, db); n != 0 {
		t.Fatalf("%d notices after a rolled-back group", n)
	}
}

// The COMMIT of a group is lost: every payment in it has an unknown
// outcome, never success.
func TestPayGroupReportsCommitUnknown(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	seed(t, db, "U1", 1, "1.00", "10.00")
	seed(t, db, "U2", 2, "1.00", "10.00")
	applied, err := order.PayGroup(order.NewStore(commitCuttingDB(t, dsn)), context.Background(),
		[]order.Payment{pay("U1", 1, 100), pay("U2", 2, 100), pay("U3", 3, 100)})
	if !errors.Is(err, sqldb.ErrCommitUnknown) {
		t.Fatalf("payGroup = %v, want ErrCommitUnknown", err)
	}
	if want := []bool{true, true, false}; !slices.Equal(applied, want) {
		t.Fatalf("applied %v, want %v", applied, want)
	}
	// The premise: the COMMIT never reached the server (the proxy cut it).
	if got := read(t, db, "U1", 1); got != (state{Status: order.Init, Balance: 1000}) {
		t.Fatalf("after a COMMIT the server never saw: %+v", got)
	}
}

// together has a Grouper over store answer ps from one group: a first
// payment takes the only committer and waits on an account locked through
// db while ps queue up behind it. It returns each payment's answer, the
// sizes of the groups formed and the first payment's answer.
func together(t *testing.T, db *sqlx.DB, store *order.Store, size int, ps []order.Payment) ([]error, []int, error) {
	t.Helper()
	ctx := context.Background()
	seed(t, db, "BLOCKER", 999, "1.00", "10.00")
	lock, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	var one int
	if err := lock.Get(&one, "SELECT 1 FROM t_account WHERE user_id = 999 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sizes []int
	g := store.StartGrouper(1, size, func(n int) { mu.Lock(); sizes = append(sizes, n); mu.Unlock() })
	defer func() { lock.Rollback(); g.Stop() }() // the lock first: Stop waits for the committer
	blocked := make(chan error, 1)
	go func() { blocked <- g.Pay(ctx, pay("BLOCKER", 999, 100)) }()
	testenv.Eventually(t, 10*time.Second, func() bool {
		var waits int
		err := db.Get(&waits, `SELECT COUNT(*) FROM information_schema.processlist
			WHERE db = DATABASE() AND info LIKE 'UPDATE t_account SET balance%999%'`)
		return err == nil && waits == 1
	}, "the committer waits on the locked account")
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { errs[i] = g.Pay(ctx, p) })
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return order.Waiting(g) == len(ps) },
		"every payment is queued")
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	blockerErr := <-blocked
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	return errs, sizes, blockerErr
}

// Through a Grouper each payment gets the answer Store.Pay would give it
// alone, also when a group holds a duplicate of one of its own payments.
func TestGrouperAnswersAsPayAlone(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ps := append(mixedGroup(t, db), pay("G1", 1, 1000)) // G1 twice
	errs, sizes, blocker := together(t, db, order.NewStore(db), 10, ps)
	if blocker != nil {
		t.Fatalf("blocker: %v", blocker)
	}
	if !slices.ContainsFunc(sizes, func(n int) bool { return n > 1 }) {
		t.Fatalf("group sizes %v: no group formed", sizes)
	}
	wants := []error{nil, account.ErrInsufficientBalance, nil, order.ErrMismatch, order.ErrNotFound, order.ErrAlreadyPaid}
	for i, want := range wants {
		if p := ps[i]; p.OrderNo == "G1" {
			continue
		} else if want == nil && errs[i] != nil || want != nil && !errors.Is(errs[i], want) {
			t.Errorf("%s: %v, want %v", p.OrderNo, errs[i], want)
		}
	}
	// G1 twice: one applies it, the other is a duplicate.
	g1 := []error{errs[2], errs[6]}
	if !slices.Contains(g1, nil) || !slices.ContainsFunc(g1, func(e error) bool { return errors.Is(e, order.ErrAlreadyPaid) }) {
		t.Errorf("G1 twice: %v, want one nil and one ErrAlreadyPaid", g1)
	}
	if got, want := read(t, db, "G1", 1), (state{order.Paid, 7000, 1, -1000}); got != want {
		t.Errorf("G1: %+v, want %+v", got, want)
	}
	if n := outboxRows(t, db); n != 3 { // G1, G4 and the blocker
		t.Errorf("%d notices, want 3", n)
	}
}

// A group that fails before COMMIT is not the last word: each of its
// payments is run alone and gets its own answer.
func TestGrouperRunsEachAloneAfterAnError(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	seed(t, db, "E1", 1, "1.00", "10.00")
	seed(t, db, "E2", 2, "2.00", "10.00")
	db.MustExec("INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES (2, -2.00, 'E2', 'PAY_DEDUCT')")
	errs, sizes, blocker := together(t, db, order.NewStore(db), 10, []order.Payment{pay("E1", 1, 100), pay("E2", 2, 200)})
	if blocker != nil {
		t.Fatalf("blocker: %v", blocker)
	}
	if !slices.Contains(sizes, 2) {
		t.Fatalf("group sizes %v: E1 and E2 not grouped", sizes)
	}
	if errs[0] != nil {
		t.Errorf("E1: %v, want applied alone", errs[0])
	}
	if !errors.Is(errs[1], account.ErrDuplicateFlow) {
		t.Errorf("E2: %v, want ErrDuplicateFlow", errs[1])
	}
	if got, want := read(t, db, "E1", 1), (state{order.Paid, 900, 1, -100}); got != want {
		t.Errorf("E1: %+v, want %+v", got, want)
	}
}

// A group whose COMMIT is lost answers every payment in it "outcome
// unknown" (requeue, never ack), not success and not "run alone".
func TestGrouperReportsCommitUnknown(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	seed(t, db, "U1", 1, "1.00", "10.00")
	seed(t, db, "U2", 2, "1.00", "10.00")
	errs, sizes, _ := together(t, db, order.NewStore(commitCuttingDB(t, dsn)), 10,
		[]order.Payment{pay("U1", 1, 100), pay("U2", 2, 100)})
	if !slices.Contains(sizes, 2) {
		t.Fatalf("group sizes %v: U1 and U2 not grouped", sizes)
	}
	for i, err := range errs {
		if !errors.Is(err, sqldb.ErrCommitUnknown) {
			t.Errorf("payment %d: %v, want ErrCommitUnknown", i, err)
		}
	}
}

// Many payments and their duplicates, from many goroutines at once, on a
// few accounts: each order is paid once, each balance is exact, and no
// payment is lost to a deadlock.
func TestGrouperUnderLoad(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	const orders, users = 300, 7
	want := map[int64]money.Cents{}
	var ps []order.Payment
	for i := range orders {
		u := int64(i%users + 1)
		amount := money.Cents(100 + i)
		no := fmt.Sprintf("L%04d", i)
		seed(t, db, no, u, amount.String(), "1000000.00")
		want[u] += amount
		ps = append(ps, pay(no, u, amount), pay(no, u, amount))
	}
	var mu sync.Mutex
	grouped := 0
	g := order.NewStore(db).StartGrouper(3, 10, func(n int) {
		if n > 1 {
			mu.Lock()
			grouped++
			mu.Unlock()
		}
	})
	defer g.Stop()
	work := make(chan order.Payment)
	results := map[string][]error{}
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for p := range work {
				err := g.Pay(context.Background(), p)
				mu.Lock()
				results[p.OrderNo] = append(results[p.OrderNo], err)
				mu.Unlock()
			}
		})
	}
	for _, p := range ps {
		work <- p
	}
	close(work)
	wg.Wait()
	for no, errs := range results {
		applied, dup := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				applied++
			case errors.Is(err, order.ErrAlreadyPaid):
				dup++
			default:
				t.Errorf("%s: %v", no, err)
			}
		}
		if applied != 1 || dup != 1 {
			t.Errorf("%s: applied %d times, %d duplicates", no, applied, dup)
		}
	}
	for u, spent := range want {
		var balance money.Cents
		if err := db.Get(&balance, "SELECT balance FROM t_account WHERE user_id = ?", u); err != nil {
			t.Fatal(err)
		}
		if balance != 100000000-spent {
			t.Errorf("user %d: balance %s, want %s", u, balance, 100000000-spent)
		}
	}
	var flows int
	db.Get(&flows, "SELECT COUNT(*) FROM t_account_flow")
	if flows != orders {
		t.Errorf("%d flows, want %d", flows, orders)
	}
	if grouped == 0 {
		t.Fatal("no group held more than one payment: the test did not exercise grouping")
	}
	t.Logf("%d groups of more than one payment", grouped)
}

// A group writes its payments in (user, order) order whatever order they
// came in, so that two groups take their row locks in the same order and
// cannot wait on each other in a cycle. The flows' ids show the order.
func TestGrouperWritesInLockOrder(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	ps := []order.Payment{pay("C", 3, 100), pay("B", 1, 100), pay("D", 2, 100), pay("A", 1, 100)}
	for _, p := range ps {
		seed(t, db, p.OrderNo, p.UserID, "1.00", "10.00")
	}
	errs, sizes, blocker := together(t, db, order.NewStore(db), 10, ps)
	if blocker != nil || slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		t.Fatalf("blocker %v, payments %v", blocker, errs)
	}
	if !slices.Contains(sizes, len(ps)) {
		t.Fatalf("group sizes %v: the payments were not grouped", sizes)
	}
	var got []string
	if err := db.Select(&got, "SELECT biz_no FROM t_account_flow WHERE biz_no <> 'BLOCKER' ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"A", "B", "D", "C"}; !slices.Equal(got, want) {
		t.Fatalf("flows written in order %v, want %v", got, want)
	}
}

// A group none of whose payments could be applied leaves no transaction
// open on the connection it gives back to the pool.
func TestPayGroupOfNothingClosesItsTransaction(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.SetMaxOpenConns(1) // the next query gets the group's connection
	seed(t, db, "N1", 1, "1.00", "10.00")
	db.MustExec("UPDATE t_order SET status = 'PAID' WHERE order_no = 'N1'")
	applied, err := order.PayGroup(order.NewStore(db), context.Background(),
		[]order.Payment{pay("N1", 1, 100), pay("N2", 2, 100)})
	if err != nil || slices.Contains(applied, true) {
		t.Fatalf("payGroup = %v, %v; want nothing applied, no error", applied, err)
	}
	if inTransaction(t, db) {
		t.Fatal("the group's transaction is still open on the pooled connection")
	}
}

// A user's payments in one group whose sum does not fit DECIMAL(18,2) are
// not grouped (each runs alone): in int64 cents that sum could wrap around
// and deduct less than the payments. Here 19 payments of
// 9,708,812,670,373,448.22 sum to 0.02 modulo 2^64, and the balance is
// 1.00.
func TestPayGroupNeverWrapsAUsersSum(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	const amount = money.Cents(970881267037344822)
	var ps []order.Payment
	for i := range 19 {
		no := fmt.Sprintf("WRAP%02d", i)
		seed(t, db, no, 1, amount.String(), "1.00")
		ps = append(ps, pay(no, 1, amount))
	}
	applied, err := order.PayGroup(order.NewStore(db), context.Background(), ps)
	if err != nil {
		t.Fatalf("payGroup: %v", err)
	}
	if slices.Contains(applied, true) {
		t.Fatalf("applied %v, want none: the balance is 1.00", applied)
	}
	if got, want := read(t, db, "WRAP00", 1), (state{order.Init, 100, 0, 0}); got != want {
		t.Fatalf("WRAP00: %+v, want %+v", got, want)
	}
}

// inTransaction reports whether the pool's next connection is inside a
// transaction: @@in_transaction, or on TiDB, which has none, a
// transaction's start timestamp.
func inTransaction(t *testing.T, db *sqlx.DB) bool {
	t.Helper()
	var open int64
	err := db.Get(&open, "SELECT @@in_transaction")
	if me := (*mysql.MySQLError)(nil); errors.As(err, &me) && me.Number == 1193 { // unknown variable
		err = db.Get(&open, "SELECT @@tidb_current_ts")
	}
	if err != nil {
		t.Fatal(err)
	}
	return open != 0
}
