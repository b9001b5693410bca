//go:build unix

package loadtest

import (
	"fmt"
	"syscall"

	"github.com/kshard/kshard/internal/childproc"
)

// pause stops the child (SIGSTOP to its group) until resume. Unlike the
// signals that end it, a pause leaves an exit unasked for: a paused child
// that exits is a failure of the run.
func (p *process) pause() error {
	if err := childproc.SignalGroup(p.pid(), syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pausing %s (pid %d): %w", p.name, p.pid(), err)
	}
	return nil
}

// resume lets a paused child run again (SIGCONT to its group); a child that
// runs ignores it.
func (p *process) resume() error {
	if err := childproc.SignalGroup(p.pid(), syscall.SIGCONT); err != nil {
		return fmt.Errorf("resuming %s (pid %d): %w", p.name, p.pid(), err)
	}
	return nil
}
