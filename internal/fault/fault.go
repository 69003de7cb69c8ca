//go:build !faultinject

// Package fault holds crash points for the fault-injection suite. In
// normal builds Point does nothing and compiles away; builds with the
// faultinject tag kill the process at a chosen point (see
// fault_inject.go). The deliberately broken builds that show the suite
// can fail are not here: paychaos -mutation patches a copy of the source
// (tools/paychaos/mutants.go).
package fault

// Point marks a place where a test build may crash the process.
func Point(name string) {}
