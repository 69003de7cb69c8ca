//go:build !faultinject

// Package fault holds crash points and deliberate defects for the
// fault-injection suite. In normal builds Point and Mutated do nothing and
// compile away; builds with the faultinject tag kill the process at a
// chosen point, or break one guarantee on purpose, to show that the suite
// notices (see fault_inject.go).
package fault

// Point marks a place where a test build may crash the process.
func Point(name string) {}

// Mutated reports whether a test build was asked to break the guarantee
// named name. Always false here.
func Mutated(name string) bool { return false }
