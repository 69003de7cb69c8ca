package idem_test

import (
	"context"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/testenv"
)

// The ledger counts what is overdue at a time, forgets a copy that came
// back, and prunes what was overdue too long; order numbers with glob
// characters are listed as themselves.
func TestRetryLedger(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	r := idem.New(rdb, idem.Config{KeyPrefix: prefix}).Retries()
	t0 := time.Now().Truncate(time.Millisecond)
	copies := []idem.RetryCopy{
		{OrderNo: "A*1", Attempt: 1, Queue: "q.pay.dlx.wait.30s", OverdueAt: t0},
		{OrderNo: "A11", Attempt: 1, Queue: "q.pay.dlx.wait.30s", OverdueAt: t0.Add(time.Hour)},
		{OrderNo: "B1", Attempt: 2, Queue: "q.pay.dlx.wait.1m", OverdueAt: t0.Add(2 * time.Hour)},
	}
	for _, c := range copies {
		if err := r.Sent(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	count := func(at time.Time) int64 {
		n, err := r.Overdue(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := []int64{count(t0.Add(-time.Second)), count(t0), count(t0.Add(90 * time.Minute)), count(t0.Add(3 * time.Hour))}; got[0] != 0 || got[1] != 1 || got[2] != 2 || got[3] != 3 {
		t.Fatalf("overdue over time %v, want [0 1 2 3]", got)
	}
	if of, err := r.Of(ctx, "A*1"); err != nil || len(of) != 1 || of[0] != copies[0] {
		t.Fatalf("Of(A*1) = %+v (%v), want %+v alone", of, err, copies[0])
	}
	if err := r.Back(ctx, copies[1]); err != nil {
		t.Fatal(err)
	}
	if n := count(t0.Add(3 * time.Hour)); n != 2 {
		t.Fatalf("%d overdue after a copy came back, want 2", n)
	}
	if err := r.Prune(ctx, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if of, _ := r.Of(ctx, "A*1"); len(of) != 0 {
		t.Fatalf("pruned copy still listed: %+v", of)
	}
	if n := count(t0.Add(3 * time.Hour)); n != 1 {
		t.Fatalf("%d overdue after the prune, want 1 (B1)", n)
	}
}
