package childproc

import (
	"errors"
	"os/exec"
	"runtime"
	"sync"
)

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("the spawner is closed")

// Spawner starts every child from one goroutine locked to its OS thread.
// Pdeathsig (see SysProcAttr) fires when the *thread* that forked a child
// exits, not the process, and the Go runtime may end a thread whose locked
// goroutine returns: forking from an ordinary goroutine could kill a child
// at a random moment. The spawner's thread lives until Close, after every
// child stopped; if the parent dies first, its death takes the children
// with it.
type Spawner struct {
	reqs chan spawnRequest
	once sync.Once
	done chan struct{}
}

type spawnRequest struct {
	cmd  *exec.Cmd
	errc chan error
}

// NewSpawner starts the spawning thread.
func NewSpawner() *Spawner {
	s := &Spawner{reqs: make(chan spawnRequest), done: make(chan struct{})}
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the runtime ends the thread with the goroutine.
		defer close(s.done)
		for req := range s.reqs {
			req.errc <- req.cmd.Start()
		}
	}()
	return s
}

// Start starts cmd from the spawning thread (set cmd.SysProcAttr to
// SysProcAttr()).
func (s *Spawner) Start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	select {
	case s.reqs <- spawnRequest{cmd: cmd, errc: errc}:
	case <-s.done:
		return ErrClosed
	}
	return <-errc
}

// Close ends the spawning thread; call it after every child stopped.
func (s *Spawner) Close() {
	s.once.Do(func() { close(s.reqs) })
	<-s.done
}
