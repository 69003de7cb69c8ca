package main

import (
	"math/rand/v2"
	"reflect"
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
