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
