package order_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/sqldb"
	"github.com/paysvc/paysvc/internal/testenv"
)

// One user's account row held locked by another transaction (an admin's,
// a batch job's, a fraud hold) throttles nobody else. 200 payments of ten
// users arrive at once through 64 concurrent Pay calls, each bounded by
// 30 s, with paysvc's default pool, lock wait and grouping: at least 90% of
// the other nine users' payments are applied within 15 s, while the locked
// user's payments come back as lock wait timeouts, none applied. Once the
// lock is gone the locked user's payments apply; every order is paid once
// and every balance is exact.
func TestGrouperLockedAccountThrottlesNoOneElse(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	const users, each, locked = 10, 20, int64(5)
	var ps []order.Payment
	spent := map[int64]money.Cents{}
	for i := range each {
		for u := range int64(users) {
			p := pay(fmt.Sprintf("LK%d-%02d", u+1, i), u+1, money.Cents(100+i))
			seed(t, db, p.OrderNo, p.UserID, p.Amount.String(), "1000.00")
			spent[p.UserID] += p.Amount
			ps = append(ps, p)
		}
	}
	pool, err := sqldb.OpenWith(context.Background(), dsn, sqldb.Options{MaxOpen: 20}) // the default lock wait, 5 s
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	g := order.NewStore(pool).StartGrouper(2, 16, nil)
	defer g.Stop()

	holder := db.MustBegin()
	holder.MustExec("SELECT balance FROM t_account WHERE user_id = ? FOR UPDATE", locked)
	var wg sync.WaitGroup
	defer func() { holder.Rollback(); wg.Wait() }() // the lock first: the payments wait on it

	// Each payment is paid once by one of 64 workers; answers[i] is its
	// answer, set when answered (done counts them).
	answers := make([]error, len(ps))
	var done, othersApplied atomic.Int32
	work := make(chan int, len(ps))
	for i := range ps {
		work <- i
	}
	close(work)
	start := time.Now()
	for range 64 {
		wg.Go(func() {
			for i := range work {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := g.Pay(ctx, ps[i])
				cancel()
				answers[i] = err
				if err == nil && ps[i].UserID != locked {
					othersApplied.Add(1)
				}
				done.Add(1)
			}
		})
	}
	const others = (users - 1) * each
	for othersApplied.Load() < others*9/10 && time.Since(start) < 15*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	if n := othersApplied.Load(); n < others*9/10 {
		t.Fatalf("%d of the other users' %d payments applied in 15 s while one account is locked, want 90%%", n, others)
	}
	t.Logf("90%% of the other users' payments applied after %s", time.Since(start).Round(time.Millisecond))
	testenv.Eventually(t, 30*time.Second, func() bool { return done.Load() == int32(len(ps)) }, "every payment answered")
	t.Logf("every payment answered after %s", time.Since(start).Round(time.Millisecond))

	// The lock still holds: none of the locked user's payments is applied,
	// and each says why.
	var retry []order.Payment
	for i, p := range ps {
		switch err := answers[i]; {
		case p.UserID == locked && !sqldb.IsLockWait(err):
			t.Errorf("%s of the locked user: %v, want a lock wait timeout", p.OrderNo, err)
		case p.UserID != locked && err != nil:
			t.Logf("%s: %v", p.OrderNo, err) // not applied here: paid again below, as a retry would
			retry = append(retry, p)
		}
		if p.UserID == locked {
			retry = append(retry, p)
		}
	}
	if got := read(t, db, "LK5-00", locked); got != (state{Status: order.Init, Balance: 100000}) {
		t.Errorf("the locked user while locked: %+v, want untouched", got)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	for _, p := range retry {
		if err := g.Pay(context.Background(), p); err != nil {
			t.Errorf("%s after the lock is released: %v", p.OrderNo, err)
		}
	}
	for u := range int64(users) {
		var balance money.Cents
		var flows int
		if err := db.Get(&balance, "SELECT balance FROM t_account WHERE user_id = ?", u+1); err != nil {
			t.Fatal(err)
		}
		if err := db.Get(&flows, "SELECT COUNT(*) FROM t_account_flow WHERE user_id = ?", u+1); err != nil {
			t.Fatal(err)
		}
		if balance != 100000-spent[u+1] || flows != each {
			t.Errorf("user %d: balance %s with %d flows, want %s with %d", u+1, balance, flows, 100000-spent[u+1], each)
		}
	}
	var paid, notices int
	db.Get(&paid, "SELECT COUNT(*) FROM t_order WHERE status = 'PAID'")
	db.Get(&notices, "SELECT COUNT(*) FROM t_outbox")
	if paid != len(ps) || notices != len(ps) {
		t.Errorf("%d orders paid and %d notices, want %d of each", paid, notices, len(ps))
	}
}

// lockedRow is what Store.OnLocked is told.
type lockedRow struct {
	user int64
	no   string
}

// waitingOnAccounts counts this database's statements that wait for (or
// run) an account update.
func waitingOnAccounts(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	if err := db.Get(&n, `SELECT COUNT(*) FROM information_schema.processlist
		WHERE db = DATABASE() AND info LIKE 'UPDATE t_account SET balance%'`); err != nil {
		t.Fatal(err)
	}
	return n
}

// Once a payment run alone has waited out a locked account row, the user's
// payments go to the database one at a time: the one in it waits for the
// row alone, the others are answered at once with ErrAccountLocked, a lock
// wait timeout (retried later) that says why. Other users' payments are
// not held. A payment applied after the release unmarks the user. The
// same on a server without SKIP LOCKED, where the payment's own lock wait
// timeout marks its account.
func TestGrouperPaysALockedUserOneAtATime(t *testing.T) {
	t.Parallel()
	for _, skipLocked := range []bool{true, false} {
		t.Run(fmt.Sprintf("skipLocked=%v", skipLocked), func(t *testing.T) {
			t.Parallel()
			dsn, db := testenv.MySQL(t)
			if skipLocked {
				needSkipLocked(t, db)
			}
			var ps []order.Payment
			for i := range 5 {
				p := pay(fmt.Sprintf("ONE%d", i), 7, 100)
				seed(t, db, p.OrderNo, 7, "1.00", "10.00")
				ps = append(ps, p)
			}
			seed(t, db, "OTHER", 8, "1.00", "10.00")
			pool, err := sqldb.OpenWith(context.Background(), dsn, sqldb.Options{MaxOpen: 8, LockWait: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			store := order.NewStore(pool)
			var held atomic.Int32
			var locked []lockedRow
			store.OnHeld = func() { held.Add(1) }
			store.OnLocked = func(user int64, no string) { locked = append(locked, lockedRow{user, no}) }
			g := store.StartGrouper(2, 16, nil)
			defer g.Stop()
			if !skipLocked {
				order.WithoutSkipLocked(g)
			}
			ctx := context.Background()

			holder := db.MustBegin()
			defer holder.Rollback()
			holder.MustExec("SELECT balance FROM t_account WHERE user_id = 7 FOR UPDATE")

			// The first waits the lock out, unwarned, and marks the user.
			if err := g.Pay(ctx, ps[0]); !sqldb.IsLockWait(err) || errors.Is(err, order.ErrAccountLocked) {
				t.Fatalf("%s: %v, want a lock wait timeout of its own", ps[0].OrderNo, err)
			}
			if want := []lockedRow{{7, ""}}; !slices.Equal(locked, want) {
				t.Fatalf("rows found locked: %v, want %v", locked, want)
			}
			// The next takes the user's turn and waits in the database.
			turn := make(chan error, 1)
			go func() { turn <- g.Pay(ctx, ps[1]) }()
			testenv.Eventually(t, 10*time.Second, func() bool { return waitingOnAccounts(t, db) == 1 },
				"the user's turn waits for the account row")
			// The others are answered at once meanwhile; nothing else waits.
			for _, p := range ps[2:] {
				err := g.Pay(ctx, p)
				if !errors.Is(err, order.ErrAccountLocked) || !sqldb.IsLockWait(err) ||
					!strings.Contains(err.Error(), "account row found locked") {
					t.Errorf("%s while the turn waits: %v, want ErrAccountLocked, a lock wait timeout", p.OrderNo, err)
				}
				if n := waitingOnAccounts(t, db); n != 1 {
					t.Errorf("%d of the user's payments in the database, want 1", n)
				}
			}
			if err := g.Pay(ctx, pay("OTHER", 8, 100)); err != nil {
				t.Errorf("another user's payment: %v", err)
			}
			select {
			case err := <-turn:
				t.Fatalf("the turn answered %v before its lock wait ended", err)
			default:
			}
			if err := <-turn; !sqldb.IsLockWait(err) || errors.Is(err, order.ErrAccountLocked) {
				t.Fatalf("%s, the turn: %v, want a lock wait timeout of its own", ps[1].OrderNo, err)
			}
			if got := read(t, db, ps[0].OrderNo, 7); got != (state{Status: order.Init, Balance: 1000}) {
				t.Fatalf("the locked user: %+v, want untouched", got)
			}

			// Released: one payment applies and unmarks the user; the rest
			// are not held any more.
			if err := holder.Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := g.Pay(ctx, ps[2]); err != nil {
				t.Fatalf("%s after the release: %v", ps[2].OrderNo, err)
			}
			before := held.Load()
			var wg sync.WaitGroup
			for _, p := range append(ps[:2:2], ps[3:]...) {
				wg.Go(func() {
					if err := g.Pay(ctx, p); err != nil {
						t.Errorf("%s after the release: %v", p.OrderNo, err)
					}
				})
			}
			wg.Wait()
			if n := held.Load() - before; n != 0 {
				t.Errorf("%d payments held after the user was unmarked", n)
			}
			if got := read(t, db, ps[0].OrderNo, 7); got != (state{order.Paid, 500, 1, -100}) {
				t.Errorf("the user after the release: %+v", got)
			}
		})
	}
}

// An order row held locked by another transaction keeps its own payment
// out of the groups, so that its retries do not make a group wait: it runs
// alone until it is applied, and its lock wait timeout stays its own
// (not ErrAccountLocked: the account is free).
func TestGrouperKeepsALockedOrderOutOfGroups(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	needSkipLocked(t, db)
	seed(t, db, "LOCKED", 1, "1.00", "10.00")
	seed(t, db, "FREE", 1, "2.00", "10.00")
	pool, err := sqldb.OpenWith(context.Background(), dsn, sqldb.Options{MaxOpen: 8, LockWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store := order.NewStore(pool)
	var held atomic.Int32
	var locked []lockedRow
	store.OnHeld = func() { held.Add(1) }
	store.OnLocked = func(user int64, no string) { locked = append(locked, lockedRow{user, no}) }
	g := store.StartGrouper(2, 16, nil)
	defer g.Stop()
	ctx := context.Background()

	holder := db.MustBegin()
	defer holder.Rollback()
	holder.MustExec("SELECT status FROM t_order WHERE order_no = 'LOCKED' FOR UPDATE")
	if err := g.Pay(ctx, pay("LOCKED", 1, 100)); !sqldb.IsLockWait(err) {
		t.Fatalf("LOCKED: %v, want a lock wait timeout", err)
	}
	if want := []lockedRow{{0, "LOCKED"}}; !slices.Equal(locked, want) {
		t.Fatalf("rows found locked: %v, want %v", locked, want)
	}
	if err := g.Pay(ctx, pay("LOCKED", 1, 100)); !sqldb.IsLockWait(err) || errors.Is(err, order.ErrAccountLocked) {
		t.Fatalf("LOCKED again: %v, want its own lock wait timeout", err)
	}
	if n := held.Load(); n != 1 {
		t.Fatalf("%d payments held out of groups, want LOCKED's second", n)
	}
	// The same user's other order is not held.
	if err := g.Pay(ctx, pay("FREE", 1, 200)); err != nil || held.Load() != 1 {
		t.Fatalf("FREE: %v, %d held", err, held.Load())
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := g.Pay(ctx, pay("LOCKED", 1, 100)); err != nil {
		t.Fatalf("LOCKED after the release: %v", err)
	}
	if err := g.Pay(ctx, pay("LOCKED", 1, 100)); !errors.Is(err, order.ErrAlreadyPaid) || held.Load() != 2 {
		t.Fatalf("LOCKED once more: %v with %d held; want a duplicate, not held", err, held.Load())
	}
	if got := read(t, db, "LOCKED", 1); got != (state{order.Paid, 700, 1, -100}) {
		t.Fatalf("LOCKED: %+v", got)
	}
}

// A group in the database that waits for an account row which a payment
// run alone then finds locked is cut short (its statement killed, no
// COMMIT), and its other payments are applied at once instead of after
// the group's own lock wait. Here L1 waits for user 9's locked account
// alone on one committer; X keeps the other committer busy until L1 has
// waited 2 of its 4 s, then A and L2 go to the database as a group, which
// waits for the same row.
func TestGrouperCutsAGroupWaitingForALockedRow(t *testing.T) {
	t.Parallel()
	dsn, db := testenv.MySQL(t)
	needSkipLocked(t, db) // L1's lock wait finds the row by SKIP LOCKED
	seed(t, db, "L1", 9, "1.00", "10.00")
	seed(t, db, "L2", 9, "1.00", "10.00")
	seed(t, db, "X", 2, "1.00", "10.00")
	seed(t, db, "A", 1, "1.00", "10.00")
	const lockWait = 4 * time.Second
	pool, err := sqldb.OpenWith(context.Background(), dsn, sqldb.Options{MaxOpen: 8, LockWait: lockWait})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var mu sync.Mutex
	var sizes []int
	g := order.NewStore(pool).StartGrouper(2, 16, func(n int) { mu.Lock(); sizes = append(sizes, n); mu.Unlock() })
	defer g.Stop()
	ctx := context.Background()

	account := db.MustBegin()
	defer account.Rollback()
	account.MustExec("SELECT balance FROM t_account WHERE user_id = 9 FOR UPDATE")
	orderX := db.MustBegin()
	defer orderX.Rollback()
	orderX.MustExec("SELECT status FROM t_order WHERE order_no = 'X' FOR UPDATE")

	answers := map[string]chan error{}
	payAsync := func(p order.Payment) {
		answer := make(chan error, 1)
		answers[p.OrderNo] = answer
		go func() { answer <- g.Pay(ctx, p) }()
	}
	payAsync(pay("L1", 9, 100))
	payAsync(pay("X", 2, 100))
	var waited int
	testenv.Eventually(t, 10*time.Second, func() bool {
		err := db.Get(&waited, `SELECT COALESCE(MAX(time), 0) FROM information_schema.processlist
			WHERE db = DATABASE() AND info LIKE 'UPDATE t_account SET balance%'`)
		return err == nil && waited >= 2
	}, "L1 waits for the locked account")
	payAsync(pay("A", 1, 100))
	payAsync(pay("L2", 9, 100))
	testenv.Eventually(t, 10*time.Second, func() bool { return order.Waiting(g) == 2 }, "A and L2 wait for a committer")
	released := time.Now()
	orderX.Rollback()
	if err := <-answers["X"]; err != nil {
		t.Fatalf("X: %v", err)
	}
	if err := <-answers["A"]; err != nil {
		t.Fatalf("A: %v", err)
	}
	if took := time.Since(released); took > lockWait-time.Second {
		t.Errorf("A applied %s after its group began, want before the group's own lock wait (%s) ends", took, lockWait)
	}
	mu.Lock()
	if !slices.Contains(sizes, 2) {
		t.Errorf("group sizes %v: A and L2 not grouped", sizes)
	}
	mu.Unlock()
	if err := <-answers["L1"]; !sqldb.IsLockWait(err) {
		t.Errorf("L1: %v, want a lock wait timeout", err)
	}
	if err := <-answers["L2"]; !sqldb.IsLockWait(err) {
		t.Errorf("L2: %v, want a lock wait timeout", err)
	}
	if got := read(t, db, "L2", 9); got != (state{Status: order.Init, Balance: 1000}) {
		t.Errorf("L2 while locked: %+v", got)
	}
}

// A group cut short before its COMMIT commits nothing and leaves no
// transaction open on the connection it gives back.
func TestPayGroupCutBeforeCommitChangesNothing(t *testing.T) {
	t.Parallel()
	_, db := testenv.MySQL(t)
	db.SetMaxOpenConns(1) // the next query gets the group's connection
	seed(t, db, "C1", 1, "1.00", "10.00")
	seed(t, db, "C2", 2, "1.00", "10.00")
	applied, err := order.PayGroupUncommitted(order.NewStore(db), context.Background(),
		[]order.Payment{pay("C1", 1, 100), pay("C2", 2, 100)})
	if err == nil || slices.Contains(applied, true) {
		t.Fatalf("payGroup cut before COMMIT = %v, %v; want nothing applied and an error", applied, err)
	}
	if inTransaction(t, db) {
		t.Fatal("the cut group's transaction is still open on the pooled connection")
	}
	if got := read(t, db, "C1", 1); got != (state{Status: order.Init, Balance: 1000}) {
		t.Fatalf("C1: %+v, want untouched", got)
	}
	if n := outboxRows(t, db); n != 0 {
		t.Fatalf("%d notices after a cut group", n)
	}
}

// needSkipLocked skips a test of the diagnosis of locked rows on a server
// that does not honour SKIP LOCKED (TiDB): the Grouper does not diagnose
// there, as on a server without SKIP LOCKED.
func needSkipLocked(t *testing.T, db *sqlx.DB) {
	t.Helper()
	ok, err := sqldb.SkipLockedLocks(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Skip("the server does not honour SKIP LOCKED: the Grouper does not diagnose locked rows there")
	}
}
