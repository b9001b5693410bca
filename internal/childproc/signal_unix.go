//go:build unix

package childproc

import (
	"errors"
	"syscall"
)

// SignalGroup signals a child's whole process group, whose id is the
// child's pid; a group already gone is not an error.
func SignalGroup(pid int, sig syscall.Signal) error {
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// Pause stops the child (SIGSTOP to its group) until Resume, as a long GC
// pause or a frozen VM would. Unlike Terminate it leaves an exit unasked
// for: a paused child that exits is a failure of the run.
func (p *Process) Pause() error { return p.signal(syscall.SIGSTOP, false) }

// Resume lets a paused child run again (SIGCONT to its group); a child that
// runs ignores it.
func (p *Process) Resume() error { return p.signal(syscall.SIGCONT, false) }
