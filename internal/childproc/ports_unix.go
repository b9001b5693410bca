//go:build unix

package childproc

import (
	"os"
	"syscall"
)

// tryLock takes f's exclusive lock if no process holds it.
func tryLock(f *os.File) bool {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}
