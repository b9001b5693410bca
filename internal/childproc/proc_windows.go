package childproc

import (
	"errors"
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

// errNoPause says Windows cannot stop a process and let it go on.
var errNoPause = errors.New("pausing a process (SIGSTOP) needs a Unix system")

// Pause is unsupported on Windows: the chaos scenario's pause fault fails.
func (p *Process) Pause() error { return errNoPause }

// Resume has nothing to resume on Windows.
func (p *Process) Resume() error { return nil }
