package childproc

import (
	"os"
	"syscall"
)

// SysProcAttr: Windows has no process groups to signal; children are
// stopped one process at a time.
func SysProcAttr() *syscall.SysProcAttr { return nil }

// SignalGroup kills the child on Windows, which cannot deliver SIGTERM:
// every stop is a crash there, and handovers wait for Lease expiry.
func SignalGroup(pid int, _ syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	return p.Kill()
}
