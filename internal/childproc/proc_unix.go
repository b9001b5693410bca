//go:build unix && !linux

package childproc

import "syscall"

// SysProcAttr puts a child in its own process group. Only Linux has
// Pdeathsig: elsewhere children of a parent killed with SIGKILL outlive it.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
