package order_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/paysvc/paysvc/internal/order"
	"github.com/paysvc/paysvc/internal/testenv"
)

// BenchmarkPay runs the payment transaction against the real MariaDB, with
// GOMAXPROCS×8 goroutines: go test -bench Pay -benchtime 5000x ./internal/order/
func BenchmarkPay(b *testing.B) {
	benchPayments(b, func(store *order.Store) (func(context.Context, order.Payment) error, func()) {
		return store.Pay, func() {}
	})
}

// BenchmarkGrouperPay is BenchmarkPay through paysvc's default grouping
// (groups of up to 16 on 2 connections).
func BenchmarkGrouperPay(b *testing.B) {
	benchPayments(b, func(store *order.Store) (func(context.Context, order.Payment) error, func()) {
		g := store.StartGrouper(2, 16, nil)
		return g.Pay, g.Stop
	})
}

func benchPayments(b *testing.B, payer func(*order.Store) (pay func(context.Context, order.Payment) error, stop func())) {
	_, db := testenv.MySQL(b)
	db.SetMaxOpenConns(64)
	db.MustExec("INSERT INTO t_account (user_id, balance) VALUES (1, 100000000.00), (2, 100000000.00), (3, 100000000.00), (4, 100000000.00)")
	n := b.N
	for lo := 0; lo < n; lo += 1000 {
		q := "INSERT INTO t_order (order_no, user_id, amount) VALUES "
		for i := lo; i < lo+1000 && i < n; i++ {
			if i > lo {
				q += ","
			}
			q += fmt.Sprintf("('B%d', %d, 1.00)", i, i%4+1)
		}
		db.MustExec(q)
	}
	pay, stop := payer(order.NewStore(db))
	defer stop()
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1) - 1
			if err := pay(context.Background(), order.Payment{OrderNo: fmt.Sprintf("B%d", i), UserID: i%4 + 1, Amount: 100}); err != nil {
				b.Error(err)
			}
		}
	})
}
