//go:build faultinject

// Package fault holds crash points for the fault-injection tests. This build
// (tag faultinject, never shipped) kills the process with SIGKILL when it
// reaches the point named by PAYSVC_FAULT_POINT, on the Nth time
// (PAYSVC_FAULT_AFTER, default 1); with PAYSVC_FAULT_ACTION=panic it panics
// there instead.
package fault

import (
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
)

var (
	once   sync.Once
	target string
	action string
	after  int64
	hits   atomic.Int64
)

func load() {
	once.Do(func() {
		target = os.Getenv("PAYSVC_FAULT_POINT")
		action = os.Getenv("PAYSVC_FAULT_ACTION")
		after = 1
		if n, err := strconv.ParseInt(os.Getenv("PAYSVC_FAULT_AFTER"), 10, 64); err == nil && n > 0 {
			after = n
		}
	})
}

// Point kills the process if name is the configured crash point.
func Point(name string) {
	load()
	if name == target && hits.Add(1) == after {
		if action == "panic" {
			panic("fault injected at " + name)
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not delivered synchronously; never return
	}
}
