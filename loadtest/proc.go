package loadtest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kshard/kshard/internal/childproc"
)

// processes starts the load tester's children (the config center and the
// replicas) and makes sure none outlives it.
//
// Each child runs in its own process group, so a Ctrl-C at the terminal
// reaches only the load tester, which then stops the children in order
// (replicas hand over while the API server still runs). On Linux each child
// also gets SIGKILL from the kernel when the thread that started it dies
// (Pdeathsig): the last line of defence when the load tester itself is
// killed. Pdeathsig follows the forking *thread*, so every child is forked
// from one goroutine locked to its OS thread for the whole run.
type processes struct {
	spawn *childproc.Spawner

	mu   sync.Mutex
	live map[*process]struct{}
	// onUnexpected is told about a child that exits without being asked.
	onUnexpected func(error)
}

func newProcesses(onUnexpected func(error)) *processes {
	return &processes{spawn: childproc.NewSpawner(), live: map[*process]struct{}{}, onUnexpected: onUnexpected}
}

// process is one child process.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	started time.Time

	mu       sync.Mutex
	stopping bool // a stop or kill was asked for
	ended    time.Time
	err      error
	done     chan struct{}
}

// start starts bin with args, its output appended to logPath.
func (ps *processes) start(name, bin, logPath string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	// The child keeps its own descriptor once started.
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = childproc.SysProcAttr()
	if err := ps.spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	ps.mu.Lock()
	ps.live[p] = struct{}{}
	ps.mu.Unlock()
	go ps.reap(p)
	return p, nil
}

func (ps *processes) reap(p *process) {
	err := p.cmd.Wait()
	p.mu.Lock()
	p.ended, p.err = time.Now(), err
	unexpected := !p.stopping
	close(p.done)
	p.mu.Unlock()
	ps.mu.Lock()
	delete(ps.live, p)
	ps.mu.Unlock()
	if unexpected && ps.onUnexpected != nil {
		ps.onUnexpected(fmt.Errorf("%s (pid %d) exited on its own (%s); the end of %s:\n%s",
			p.name, p.cmd.Process.Pid, childproc.ExitText(err), p.logPath, childproc.Tail(p.logPath, 15)))
	}
}

// pid is the child's process id.
func (p *process) pid() int { return p.cmd.Process.Pid }

func (p *process) startTime() time.Time { return p.started }

// peakRSS reads the kernel's high-water mark of its resident memory.
func (p *process) peakRSS() (float64, bool) { return readPeakRSS(p.pid()) }

// signal sends sig to the child's process group, marking the exit that
// follows as asked for.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	if err := childproc.SignalGroup(p.pid(), sig); err != nil {
		return fmt.Errorf("sending %s to %s (pid %d): %w", sig, p.name, p.pid(), err)
	}
	return nil
}

// running reports whether the child has not ended yet.
func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// terminate sends SIGTERM, and SIGCONT after it: a child paused by the
// chaos scenario handles the SIGTERM only once it runs again.
func (p *process) terminate() error {
	if err := p.signal(syscall.SIGTERM); err != nil {
		return err
	}
	return p.resume()
}

// stop sends SIGTERM and waits up to timeout, then SIGKILL. It returns when
// the process is gone, and when.
func (p *process) stop(timeout time.Duration) (time.Time, error) {
	if !p.running() {
		return p.wait()
	}
	if err := p.terminate(); err != nil {
		return time.Time{}, err
	}
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = childproc.SignalGroup(p.pid(), syscall.SIGKILL)
		<-p.done
		return p.ended, fmt.Errorf("%s did not stop within %s of SIGTERM: killed", p.name, timeout)
	}
	return p.wait()
}

// kill crashes the child (SIGKILL to its group) and waits until it is gone.
func (p *process) kill() (time.Time, error) {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return time.Time{}, err
	}
	<-p.done
	return p.ended, nil
}

// wait waits for the child to end and says when and how.
func (p *process) wait() (time.Time, error) {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended, p.err
}

// stopAll stops every child still running at once (SIGTERM, SIGKILL after
// timeout) and ends the spawning thread.
func (ps *processes) stopAll(timeout time.Duration) {
	ps.mu.Lock()
	live := make([]*process, 0, len(ps.live))
	for p := range ps.live {
		live = append(live, p)
	}
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range live {
		wg.Go(func() { _, _ = p.stop(timeout) })
	}
	wg.Wait()
	ps.spawn.Close()
}
