package controlplane

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// RunTests starts one control plane for a test binary, runs its tests and
// stops it, for use from TestMain. Starting a control plane takes seconds, so
// a package shares one and its tests keep apart by namespace.
//
//	var cp *controlplane.ControlPlane
//
//	func TestMain(m *testing.M) { os.Exit(controlplane.RunTests(m, &cp)) }
func RunTests(m *testing.M, into **ControlPlane) int {
	cp, err := Start(Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "control plane: %v\n", err)
		return 1
	}
	*into = cp
	code := m.Run()
	if err := cp.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "control plane: %v\n", err)
	}
	return code
}

// Eventually polls cond until it returns nil, and fails the test with the
// last error when the bound passes. Tests against a real control plane
// check behaviour, not speed: bounds are generous, to catch a hang rather
// than a slow, shared machine.
func Eventually(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: still failing after %s: %v", what, within, err)
}
