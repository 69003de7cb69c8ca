package idem_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/paysvc/paysvc/internal/idem"
	"github.com/paysvc/paysvc/internal/testenv"
)

// ScanDone walks more keys than one SCAN call returns and hands over
// exactly the orders whose key says done: not the claims in flight, the
// values paysvc does not write, the probe's key, the retry ledger, keys of
// another type, nor the keys of another prefix; and a glob character in
// the prefix matches only itself.
func TestScanDoneFindsEveryDoneKeyAndNothingElse(t *testing.T) {
	t.Parallel()
	rdb, base := testenv.Redis(t)
	ctx := context.Background()
	prefix := base + "p*x:"
	g := idem.New(rdb, idem.Config{KeyPrefix: prefix, TTL: time.Hour, Lease: time.Minute})
	var want []string
	for i := range 2500 {
		no := fmt.Sprintf("D%05d", i)
		if err := g.Done(ctx, no); err != nil {
			t.Fatal(err)
		}
		want = append(want, no)
	}
	if st, _, err := g.Claim(ctx, "INFLIGHT1"); err != nil || st != idem.Claimed {
		t.Fatalf("claim: %v %v", st, err)
	}
	rdb.Set(ctx, prefix+"LEGACY1", "1", time.Hour)       // a hand-written consumer's mark
	rdb.HSet(ctx, prefix+"HASH1", "f", "done")           // another type
	rdb.Set(ctx, base+"pyx:D99999", "done", time.Hour)   // matched by the glob unescaped
	rdb.Set(ctx, base+"other:D00001", "done", time.Hour) // another prefix
	rdb.Set(ctx, prefix+"~note", "done", time.Hour)      // not an order number
	if err := g.Probe(ctx); err != nil {                 // prefix + "__probe__" = "1"
		t.Fatal(err)
	}
	if err := g.Retries().Sent(ctx, idem.RetryCopy{OrderNo: "D00001", Attempt: 1, Queue: "q", OverdueAt: time.Now()}); err != nil {
		t.Fatal(err)
	}

	var got []string
	batches := 0
	if err := g.ScanDone(ctx, 0, func(orderNos []string) error {
		batches++
		got = append(got, orderNos...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	got = slices.Compact(got) // SCAN may return a key twice
	if !slices.Equal(got, want) {
		t.Fatalf("got %d orders (%v ...), want the %d done ones", len(got), got[:min(5, len(got))], len(want))
	}
	if batches < 2 {
		t.Fatalf("%d batches for 2500 keys: want SCAN's pages, not one call", batches)
	}
}

// Peek tells what an order's key holds.
func TestPeek(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	ctx := context.Background()
	g := idem.New(rdb, idem.Config{KeyPrefix: prefix, TTL: time.Hour, Lease: time.Minute})
	g.Done(ctx, "PK1")
	g.Claim(ctx, "PK2")
	rdb.Set(ctx, prefix+"PK3", "1", 0)
	rdb.HSet(ctx, prefix+"PK4", "f", "v")
	for no, want := range map[string]idem.State{"PK1": idem.Done, "PK2": idem.InFlight, "PK3": idem.Foreign, "PK4": idem.Foreign, "PK5": 0} {
		st, left, err := g.Peek(ctx, no)
		if err != nil || st != want {
			t.Errorf("%s: %v %v, want %v", no, st, err, want)
		}
		if no == "PK1" && (left <= 59*time.Minute || left > time.Hour) {
			t.Errorf("%s: %s left, want about an hour", no, left)
		}
	}
}
