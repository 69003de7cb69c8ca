package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jmoiron/sqlx"
)

// The bench draws payments from the shape's functions, never from the
// table: they must name INIT orders, distinct, with the hot share asked.
func TestDrawPaymentsNamesDistinctInitOrdersWithTheHotShare(t *testing.T) {
	s := shape{Accounts: 1000, Orders: 1100000, InitEvery: 11}
	if err := s.canDraw(5000, 0.8); err != nil {
		t.Fatal(err)
	}
	if err := s.canDraw(50000, 0.8); err == nil {
		t.Fatal("canDraw: 40,000 hot payments from 20,000 hot INIT orders allowed")
	}
	pays := drawPayments(s, 5000, 0.8)
	seen := map[string]bool{}
	hot := 0
	for _, p := range pays {
		var i int64
		if _, err := fmt.Sscanf(p.orderNo, "L%d", &i); err != nil {
			t.Fatal(err)
		}
		if i%s.InitEvery != 0 || i < 1 || i > s.Orders {
			t.Fatalf("%s is not an INIT order", p.orderNo)
		}
		if seen[p.orderNo] {
			t.Fatalf("%s drawn twice", p.orderNo)
		}
		seen[p.orderNo] = true
		if p.user != s.user(i) || p.amount != s.amount(i) {
			t.Fatalf("%s: user %d amount %s, the shape says %d %s", p.orderNo, p.user, p.amount, s.user(i), s.amount(i))
		}
		if p.user <= s.Accounts/5 {
			hot++
		}
	}
	if share := float64(hot) / float64(len(pays)); share < 0.77 || share > 0.83 {
		t.Fatalf("hot share %.3f, want 0.8", share)
	}
	// Uniform: about a fifth on the first fifth of the users.
	hot = 0
	for _, p := range drawPayments(s, 5000, 0) {
		if p.user <= s.Accounts/5 {
			hot++
		}
	}
	if share := float64(hot) / 5000; share < 0.17 || share > 0.23 {
		t.Fatalf("uniform: share %.3f on a fifth of the users", share)
	}
}

// A seed on the real server matches the shape's functions (checkSeed),
// is found again instead of seeded twice, and a drain cut after its
// journal is restored by the next open.
func TestSeedIsReusedAndACutDrainIsRestored(t *testing.T) {
	dsn := env("PAYSVC_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/")
	s := shape{DB: fmt.Sprintf("paybench_test_seed_%x", rand.Uint32()), Accounts: 100, Orders: 2200, InitEvery: 11}
	ctx := context.Background()
	t.Cleanup(func() { dropSeeded(ctx, dsn, s.DB) })
	logf := func(string) {}
	db, _, info, err := openSeeded(ctx, dsn, s, logf)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	count := func(q string) int {
		var n int
		if err := db.GetContext(ctx, &n, q); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count("SELECT COUNT(*) FROM t_order WHERE status = 'INIT'"); n != 200 {
		t.Fatalf("%d INIT orders, want 200", n)
	}
	if n := count("SELECT COUNT(*) FROM t_account_flow"); n != 2000 {
		t.Fatalf("%d flows, want 2000", n)
	}
	// A drain that paid two orders and was cut: its journal is written,
	// its restore never ran.
	pays := drawPayments(s, 2, 0)
	m, err := readMarks(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if err := journal(ctx, db, pays, m); err != nil {
		t.Fatal(err)
	}
	for _, p := range pays {
		sqlx.MustExec(db, "UPDATE t_order SET status = 'PAID', pay_time = NOW(3) WHERE order_no = ?", p.orderNo)
		sqlx.MustExec(db, "INSERT INTO t_account_flow (user_id, amount, biz_no, type) VALUES (?, -1, ?, 'PAY_DEDUCT')", p.user, p.orderNo)
		sqlx.MustExec(db, "UPDATE t_account SET balance = balance - 1 WHERE user_id = ?", p.user)
	}
	db2, _, info2, err := openSeeded(ctx, dsn, s, func(msg string) { t.Fatalf("seeded again: %s", msg) })
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if info2.seconds != info.seconds {
		t.Fatalf("seed info %+v, then %+v", info, info2)
	}
	if n, err := recoverSeed(ctx, db2, s); err != nil || n != 2 {
		t.Fatalf("recoverSeed: %d orders, %v; want 2", n, err)
	}
	if n := count("SELECT COUNT(*) FROM t_order WHERE status = 'INIT'"); n != 200 {
		t.Fatalf("after the restore %d INIT orders, want 200", n)
	}
	if n := count("SELECT COUNT(*) FROM t_account_flow"); n != 2000 {
		t.Fatalf("after the restore %d flows, want 2000", n)
	}
	if n := count("SELECT COUNT(*) FROM t_account WHERE balance <> " + balanceSeed); n != 0 {
		t.Fatalf("after the restore %d balances differ from the seed's", n)
	}
	if n, err := recoverSeed(ctx, db2, s); err != nil || n != 0 {
		t.Fatalf("a second recoverSeed: %d orders, %v; want none", n, err)
	}
}
