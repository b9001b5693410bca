package controlplane

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/childproc"
)

// RunTests starts one control plane for a test binary, runs its tests and
// stops it, for use from TestMain. Starting a control plane takes seconds, so
// a package shares one and its tests keep apart by namespace.
//
//	var cp *controlplane.ControlPlane
//
//	func TestMain(m *testing.M) { os.Exit(controlplane.RunTests(m, &cp)) }
//
// With -short (make test-unit) no control plane starts: *into stays nil,
// and the tests that need one skip through Require, so the unit tests of a
// package run in seconds.
func RunTests(m *testing.M, into **ControlPlane) int {
	return RunTestsWith(m, into, Options{})
}

// RunTestsWith is RunTests with a control plane configured by opts.
func RunTestsWith(m *testing.M, into **ControlPlane, opts Options) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	cp, err := Start(opts)
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

// Require skips a test that needs the control plane in the unit lane
// (-short), where none runs.
func Require(t testing.TB, cp *ControlPlane) {
	t.Helper()
	if cp == nil {
		t.Skip("needs the control plane: make test runs it")
	}
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

// FreeAddr returns a loopback address ("127.0.0.1:port") that nothing
// listens on now, for a server a test starts in a child process or passes
// a port to: a port from childproc.FreePorts, outside the range the kernel
// hands out for ":0", so that no other listener or connection takes it
// before the server does.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports, err := childproc.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
}
