package main

import (
	"math/big"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// defaultProcs is the Go runtime's own GOMAXPROCS for this process, read
// before any test changes it.
var defaultProcs = runtime.GOMAXPROCS(0)

// The soft memory limit is 90% of the cgroup's memory limit, read from a
// v2 memory.max or a v1 memory.limit_in_bytes; "max", v1's "no limit"
// value or no file at all set none, GOMEMLIMIT set leaves it to the
// runtime, and a file that holds no number is said, not guessed at.
func TestMemoryLimitFromCgroup(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noEnv := func(string) string { return "" }
	missing := filepath.Join(dir, "missing")
	v2 := file("memory.max", "536870912\n")                   // 512 MiB
	v1 := file("memory.limit_in_bytes", "1073741824\n")       // 1 GiB
	v2max := file("memory.max.unlimited", "max\n")            // v2: no limit
	v1max := file("limit.unlimited", "9223372036854771712\n") // v1: no limit
	odd := file("memory.max.odd", "1000000007\n")             // rounding
	bad := file("memory.max.bad", "lots\n")                   // not a number
	for _, c := range []struct {
		name  string
		env   func(string) string
		files []string
		want  int64
		from  string
	}{
		{"v2", noEnv, []string{v2, v1}, 483183820, "90% of the cgroup memory limit of 536870912 bytes"},
		{"v1 when no v2", noEnv, []string{missing, v1}, 966367641, "90% of the cgroup memory limit of 1073741824 bytes"},
		{"rounds down", noEnv, []string{odd}, 900000006, "90%"},
		{"v2 max", noEnv, []string{v2max, v1}, 0, "no cgroup memory limit"},
		{"v1 unlimited", noEnv, []string{missing, v1max}, 0, "no cgroup memory limit"},
		{"no cgroup", noEnv, []string{missing}, 0, "no cgroup memory limit found"},
		{"not a number", noEnv, []string{bad}, 0, `"lots" is not a memory limit`},
		{"GOMEMLIMIT set", func(k string) string {
			if k == "GOMEMLIMIT" {
				return "300MiB"
			}
			return ""
		}, []string{v2}, 0, "GOMEMLIMIT environment variable"},
	} {
		got, from := memoryLimitFor(c.env, c.files)
		if got != c.want || !strings.Contains(from, c.from) {
			t.Errorf("%s: %d (%s), want %d (%s)", c.name, got, from, c.want, c.from)
		}
	}
	// Exactly floor(n × 9 / 10), without overflow, up to the largest limit.
	for _, n := range []int64{1, 9, 10, 11, 1<<31 - 1, 1<<62 - 1} {
		want := new(big.Int).Div(new(big.Int).Mul(big.NewInt(n), big.NewInt(9)), big.NewInt(10))
		if got := softMemoryLimit(n); got != want.Int64() {
			t.Errorf("softMemoryLimit(%d) = %d, want %s", n, got, want)
		}
	}
}
