package childproc

import "syscall"

// SysProcAttr puts a child in its own process group and has the kernel
// SIGKILL it when the thread that started it dies: start children from a
// goroutine locked to its OS thread for the whole run.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
