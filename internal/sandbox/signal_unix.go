//go:build unix

package sandbox

import (
	"errors"
	"syscall"
)

// signalGroup signals a replica's whole process group, whose id is the
// replica's pid (Setpgid). A group that is already gone is not an error.
func signalGroup(pid int, sig syscall.Signal) error {
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
