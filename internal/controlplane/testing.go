package controlplane

import (
	"fmt"
	"os"
	"testing"
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
