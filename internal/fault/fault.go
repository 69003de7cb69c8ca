//go:build !faultinject

// Package fault holds crash points for the fault-injection tests. In normal
// builds Point does nothing and compiles away; builds with the faultinject
// tag kill the process at a chosen point (see fault_inject.go).
package fault

// Point marks a place where a test build may crash the process.
func Point(name string) {}
