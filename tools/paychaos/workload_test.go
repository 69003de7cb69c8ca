package main

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// A seed replays exactly: the same workload, the same fault choices.
func TestWorkloadIsDeterministicPerSeed(t *testing.T) {
	a := newWorkload(rand.New(rand.NewPCG(42, 7)), "T", 100, 0.3, 2)
	b := newWorkload(rand.New(rand.NewPCG(42, 7)), "T", 100, 0.3, 2)
	if !reflect.DeepEqual(a.messages, b.messages) || a.dups != b.dups {
		t.Fatal("the same seed made different workloads")
	}
	c := newWorkload(rand.New(rand.NewPCG(43, 7)), "T", 100, 0.3, 2)
	if reflect.DeepEqual(a.messages, c.messages) {
		t.Fatal("different seeds made the same workload")
	}
	if len(a.payable) != 100 || len(a.terminal) != 3 || len(a.poison) != 8 || len(a.late) == 0 {
		t.Fatalf("workload shape: %d payable, %d terminal, %d poison, %d late", len(a.payable), len(a.terminal), len(a.poison), len(a.late))
	}
	seen := map[string]bool{}
	for _, p := range a.poison {
		if seen[string(p)] {
			t.Fatal("two poison bodies are equal: they would share one dead letter")
		}
		seen[string(p)] = true
	}
}

// The totals are read per queue, the total apart from ready and unacked: a
// queue holding only what its dead-letter worker has not forwarded is not
// drained; a queue listed without numbers (no leader) is an error.
func TestCountsReadTheTotal(t *testing.T) {
	out := "q.pay.success\t0\t0\t0\nq.pay.dlx.wait.3s\t48\t0\t0\nq.pay.notify\t7\t7\t0\n"
	counts, err := parseCounts(out, []string{"q.pay.success", "q.pay.dlx.wait.3s"})
	if err != nil {
		t.Fatal(err)
	}
	if got := counts["q.pay.dlx.wait.3s"]; got != (queueCount{total: 48}) {
		t.Fatalf("q.pay.dlx.wait.3s read as %v, want 48 (ready 0, unacked 0)", got)
	}
	ok, left := drained(counts)
	if ok || len(left) != 1 || left[0] != "q.pay.dlx.wait.3s 48 (ready 0, unacked 0)" {
		t.Fatalf("drained %v %v, want the wait queue's 48 left", ok, left)
	}
	if ok, _ := drained(map[string]queueCount{"q.pay.success": {}}); !ok {
		t.Fatal("an empty queue is not drained")
	}
	if _, err := parseCounts("q.pay.success\t\t\t\n", []string{"q.pay.success"}); err == nil {
		t.Fatal("a queue listed without numbers was read")
	}
}

// retrying leaves only payable payments, every fourth of them late.
func TestRetryingShape(t *testing.T) {
	wl := newWorkload(rand.New(rand.NewPCG(42, 7)), "T", 100, 0.3, 2)
	retrying(wl)
	if len(wl.terminal) != 0 {
		t.Fatalf("%d terminal orders left", len(wl.terminal))
	}
	for _, b := range wl.messages {
		if strings.Contains(string(b), `"userId":999,`) {
			t.Fatalf("the poor user's payment %s is still published", b)
		}
	}
	if len(wl.late) < 25 {
		t.Fatalf("%d late orders of 100, want at least 25", len(wl.late))
	}
}
