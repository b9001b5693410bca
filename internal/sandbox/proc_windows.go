package sandbox

import (
	"os"
	"syscall"
)

// sysProcAttr: Windows has no process groups to signal; replicas are
// stopped one process at a time.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup stops a replica on Windows, which cannot deliver SIGTERM:
// every stop is a kill there, so handovers wait for Lease expiry.
func signalGroup(pid int, _ syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	return p.Kill()
}
