package reconcile_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/money"
	"github.com/paysvc/paysvc/internal/outbox"
	"github.com/paysvc/paysvc/internal/reconcile"
	"github.com/paysvc/paysvc/internal/testenv"
)

// lostWorld is a database as a failover leaves it, and the Redis guard of
// the payments paysvc applied before.
func lostWorld(t *testing.T) (*sqlx.DB, *idem.Guard) {
	_, db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	g := idem.New(rdb, idem.Config{KeyPrefix: prefix, TTL: time.Hour, Lease: time.Minute})
	db.MustExec(`INSERT INTO t_order (order_no, user_id, amount, status) VALUES
		('L1', 1, 12.34, 'INIT'), ('L2', 1, 5.00, 'PAID'), ('L4', 2, 6.00, 'SETTLED'), ('L5', 2, 7.00, 'INIT'),
		('L6', 3, 1.00, 'INIT'), ('L7', 3, 2.00, 'INIT'), ('L8', 4, 3.00, 'INIT'), ('L9', 4, 4.00, 'INIT')`)
	db.MustExec(`INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES (1, -5.00, 'L2', 'PAY_DEDUCT'), (2, -6.00, 'L4', 'PAY_DEDUCT')`)
	ctx := context.Background()
	// Applied before the failover: L1, L2, L3 (whose order is gone too),
	// L4, and l5 (the message spelled the order in lower case; the
	// column's collation matched it).
	for _, no := range []string{"L1", "L2", "L3", "L4", "l5"} {
		if err := g.Done(ctx, no); err != nil {
			t.Fatal(err)
		}
	}
	g.Claim(ctx, "L6")                        // a payment in flight now
	rdb.Set(ctx, g.Key("L7"), "1", time.Hour) // a hand-written consumer's mark
	return db, g
}

func lostOrders(rep reconcile.Report) []string {
	var out []string
	for _, l := range rep.Lost {
		out = append(out, l.OrderNo)
	}
	return out
}

// After a failover to a replica that missed commits, the orders whose
// Redis key says done while the order is INIT or missing are lost
// payments, with the order row's user and amount; a missing order cannot
// be re-driven. In-flight claims, foreign marks and paid orders are not
// lost. The notices of payments paysvc applied find the same, and more
// when Redis no longer has a key; the two merge per order.
func TestReconcileFindsLostPayments(t *testing.T) {
	t.Parallel()
	db, g := lostWorld(t)
	ctx := context.Background()
	rep, err := reconcile.Run(ctx, db, reconcile.Options{Done: g})
	if err != nil {
		t.Fatal(err)
	}
	if got := lostOrders(rep); !slices.Equal(got, []string{"L1", "L3", "l5"}) {
		t.Fatalf("lost %v, want L1, L3, l5", got)
	}
	l1, l3, l5 := rep.Lost[0], rep.Lost[1], rep.Lost[2]
	if l1.UserID != 1 || l1.Amount != 1234 || !l1.Redrivable() || l3.Redrivable() || l5.UserID != 2 || l5.Amount != 700 || !l5.Redrivable() {
		t.Fatalf("lost %+v", rep.Lost)
	}
	if k := kinds(rep); k[reconcile.LostPayment] != 3 || len(rep.Problems) != 3 || rep.Orders() != 3 {
		t.Fatalf("problems %+v", rep.Problems)
	}
	if p := rep.Problems[1]; p.BizNo != "L3" || !strings.Contains(p.Detail, "user and amount unknown; the order is missing") {
		t.Fatalf("L3: %+v", p)
	}
	if p := rep.Problems[0]; p.Amount != 1234 || !strings.Contains(p.Detail, "Redis key done") || !strings.Contains(p.Detail, "--fix re-drives it") {
		t.Fatalf("L1: %+v", p)
	}

	notice := func(no string, user int64, amount money.Cents) string {
		return string(outbox.PaymentSucceeded(no, user, amount, time.Now())) + "\n"
	}
	notices := notice("L1", 1, 1234) + notice("L1", 1, 1234) + "\n" + notice("L2", 1, 500) +
		notice("L8", 4, 300) + notice("L9", 4, 999) + notice("L10", 5, 100)
	rep, err = reconcile.Run(ctx, db, reconcile.Options{Done: g, Notices: strings.NewReader(notices)})
	if err != nil {
		t.Fatal(err)
	}
	if got := lostOrders(rep); !slices.Equal(got, []string{"L1", "L10", "L3", "L8", "L9", "l5"}) {
		t.Fatalf("lost %v", got)
	}
	byNo := map[string]reconcile.Lost{}
	for _, l := range rep.Lost {
		byNo[l.OrderNo] = l
	}
	if l := byNo["L1"]; !slices.Equal(l.Evidence, []string{reconcile.EvidenceRedis, reconcile.EvidenceNotice}) {
		t.Fatalf("L1 evidence %v", l.Evidence)
	}
	if l := byNo["L8"]; !l.Redrivable() || l.UserID != 4 || l.Amount != 300 {
		t.Fatalf("L8 %+v", l)
	}
	if l := byNo["L9"]; l.Redrivable() || !strings.Contains(l.Differs, "amount 9.99") {
		t.Fatalf("L9 %+v", l)
	}
	if l := byNo["L10"]; l.Redrivable() || l.Status != "" || l.UserID != 5 || l.Amount != 100 {
		t.Fatalf("L10 (no order) %+v", l)
	}

	_, err = reconcile.Run(ctx, db, reconcile.Options{Notices: strings.NewReader(notice("L1", 1, 1234) + `{"orderNo":"L1"}` + "\n")})
	if !errors.Is(err, reconcile.ErrBadNotice) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("a line that is not a notice: %v", err)
	}
}

// recheckingKeys pays an order right after the walk handed it over: a
// read that reached a server not yet up to date.
type recheckingKeys struct {
	*idem.Guard
	db *sqlx.DB
}

func (k recheckingKeys) ScanDone(ctx context.Context, rate int, fn func([]string) error) error {
	return k.Guard.ScanDone(ctx, rate, func(nos []string) error {
		err := fn(nos)
		k.db.MustExec("UPDATE t_order SET status = 'PAID' WHERE order_no = 'L1'")
		return err
	})
}

// A candidate found INIT and PAID when read again is not lost.
func TestLostPaymentIsReadTwice(t *testing.T) {
	t.Parallel()
	db, g := lostWorld(t)
	var got []string
	start := time.Now()
	err := reconcile.FindLost(context.Background(), db, recheckingKeys{g, db}, 0, func(l reconcile.Lost) error {
		got = append(got, l.OrderNo)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"L3", "l5"}) || time.Since(start) < 2*time.Second {
		t.Fatalf("lost %v after %s: want L3 and l5, read again 2s later", got, time.Since(start))
	}
}

// The daemon's sweeper reports the lost payments and logs each once; the
// count falls when one is paid again.
func TestSweeperReportsAndLogsLostPayments(t *testing.T) {
	t.Parallel()
	db, g := lostWorld(t)
	core, logs := observer.New(zap.InfoLevel)
	var mu sync.Mutex
	var reports []int
	s := &reconcile.Sweeper{DB: db, Keys: g, Every: 100 * time.Millisecond, Log: zap.New(core),
		Report: func(n int) { mu.Lock(); reports = append(reports, n); mu.Unlock() }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	last := func() int {
		mu.Lock()
		defer mu.Unlock()
		if len(reports) == 0 {
			return -1
		}
		return reports[len(reports)-1]
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return last() == 3 }, "reports %v, want 3", reports)
	testenv.Eventually(t, 20*time.Second, func() bool {
		return logs.FilterMessage("lost payments found: paysvc applied them, the database does not have them "+
			"(docs/operations.md, \"Payments lost in a database failover\")").Len() >= 2
	}, "fewer than two walks summed up")
	perOrder := map[string]int{}
	for _, e := range logs.FilterMessageSnippet("payment lost:").All() {
		perOrder[e.ContextMap()["order_no"].(string)]++
	}
	if len(perOrder) != 3 || perOrder["L1"] != 1 || perOrder["L3"] != 1 || perOrder["l5"] != 1 {
		t.Fatalf("logged per order %v: want L1, L3, l5 once each over several walks", perOrder)
	}
	db.MustExec("UPDATE t_order SET status = 'PAID' WHERE order_no = 'L1'")
	testenv.Eventually(t, 20*time.Second, func() bool { return last() == 2 }, "reports %v after L1 was paid, want 2", reports)
}
