package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"go.uber.org/zap"
)

// The CPUs and memory paysvc run takes, set once per process (main, for
// paysvc run only: the tests run the daemon inside their own process) and
// logged by the daemon at start.
//
// GOMAXPROCS: the Go runtime's own default (Go 1.25+: the CPU limit of the
// process's cgroup, rounded up, else the CPUs it may run on; followed as
// the limit changes) unless the GOMAXPROCS environment variable is set.
//
// GOMEMLIMIT: unless the environment variable is set, 90% of the cgroup's
// memory limit, so the garbage collector works harder before the kernel's
// OOM killer acts, with room left for what the Go heap does not count
// (stacks, the runtime's own memory, cgo). No limit, no soft limit.

// memLimitShare is the part of the cgroup memory limit paysvc takes as
// its soft limit, in tenths.
const memLimitShare = 9

// cgroupMemoryFiles are where the container's memory limit is read, in
// order: cgroup v2, then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// cgroupUnlimited: cgroup v1 spells "no limit" as the largest page
// count in bytes (9223372036854771712 with 4 KiB pages); no real limit
// comes near it.
const cgroupUnlimited = int64(1) << 62

// memLimitFrom says where the soft memory limit came from: set by main
// (applyMemoryLimit) for paysvc run.
var memLimitFrom = "none set by paysvc"

// cgroupMemoryLimit reads a cgroup memory limit file (v2 memory.max, v1
// memory.limit_in_bytes): the limit in bytes, or ok false for no limit
// ("max", or v1's largest value). A missing file is fs.ErrNotExist.
func cgroupMemoryLimit(path string) (limit int64, ok bool, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("%s: %q is not a memory limit", path, s)
	}
	if n >= cgroupUnlimited {
		return 0, false, nil
	}
	return n, true, nil
}

// softMemoryLimit is memLimitShare tenths of limit, rounded down, without
// overflow.
func softMemoryLimit(limit int64) int64 {
	return limit/10*memLimitShare + limit%10*memLimitShare/10
}

// memoryLimitFor decides the soft memory limit: none when GOMEMLIMIT is
// set (the runtime applies it) or no file in files holds a limit, else
// 90% of the first limit found. from says which, for the log.
func memoryLimitFor(getenv func(string) string, files []string) (limit int64, from string) {
	if getenv("GOMEMLIMIT") != "" {
		return 0, "GOMEMLIMIT environment variable"
	}
	for _, f := range files {
		n, ok, err := cgroupMemoryLimit(f)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return 0, "none: " + err.Error()
		case !ok:
			return 0, "none: no cgroup memory limit (" + f + ")"
		}
		return softMemoryLimit(n), fmt.Sprintf("%d%% of the cgroup memory limit of %d bytes (%s)", memLimitShare*10, n, f)
	}
	return 0, "none: no cgroup memory limit found"
}

// applyMemoryLimit sets the process's soft memory limit (memoryLimitFor,
// on this host's cgroup files). Process-wide: main calls it for paysvc
// run.
func applyMemoryLimit() {
	limit, from := memoryLimitFor(os.Getenv, cgroupMemoryFiles)
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	memLimitFrom = from
}

// logLimits says at start how many CPUs the goroutines run on and the
// soft memory limit, and where each came from.
func logLimits(log *zap.Logger) {
	procs, procsFrom := runtime.GOMAXPROCS(0), "Go runtime default: the CPUs available"
	switch {
	case os.Getenv("GOMAXPROCS") != "":
		procsFrom = "GOMAXPROCS environment variable"
	case procs < runtime.NumCPU():
		procsFrom = "Go runtime default: the cgroup CPU limit"
	}
	mem := debug.SetMemoryLimit(-1) // reads it
	if mem == 1<<63-1 {
		mem = 0 // none
	}
	log.Info("goroutines run on gomaxprocs CPUs; the garbage collector aims below gomemlimit bytes (0: no limit)",
		zap.Int("gomaxprocs", procs), zap.String("gomaxprocs_from", procsFrom),
		zap.Int64("gomemlimit", mem), zap.String("gomemlimit_from", memLimitFrom))
}
