//go:build unix && !linux

package sandbox

import "syscall"

// sysProcAttr puts a replica in its own process group. Only Linux has
// Pdeathsig; elsewhere the sandbox's deferred cleanup is the only guard.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
