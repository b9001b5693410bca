package sandbox

import "syscall"

// sysProcAttr puts a replica in its own process group and has the kernel
// SIGKILL it if the thread that started it dies (see spawner).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
