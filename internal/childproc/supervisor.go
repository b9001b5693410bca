package childproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrGraceExpired is wrapped by Wait's error when a child did not end within
// Terminate's grace period and was killed.
var ErrGraceExpired = errors.New("killed")

// Supervisor starts the children of a run (kshard replicas, the config
// center) and makes sure none outlives it. Each child runs in its own
// process group (SysProcAttr), so a Ctrl-C at the terminal reaches only the
// parent, which stops the children in its own order: replicas hand over
// while the API server still runs. Every child is forked from one thread
// (Spawner), so Pdeathsig kills them when the parent dies.
type Supervisor struct {
	spawn *Spawner
	// onUnexpected is told about a child that exits without being asked.
	onUnexpected func(error)

	mu   sync.Mutex
	live map[*Process]struct{}
}

// NewSupervisor starts the spawning thread. onUnexpected, if not nil, is
// told about every child that exits without being asked to (Terminate,
// Stop, Kill), with the end of its log, so a run fails at once instead of
// at its next step's timeout.
func NewSupervisor(onUnexpected func(error)) *Supervisor {
	return &Supervisor{spawn: NewSpawner(), live: map[*Process]struct{}{}, onUnexpected: onUnexpected}
}

// Process is one child process. A Process is not restarted: starting the
// same command again is a new Process.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed once reaped

	mu     sync.Mutex
	asked  bool          // a Terminate or Kill was sent: the exit is expected
	killer *time.Timer   // SIGKILL at the end of Terminate's grace period
	forced time.Duration // the grace period after which killer fired
	ended  time.Time
	err    error
}

// Start starts bin with args, its output appended to logPath after a line
// with the time and the command line; name says which child it is in
// errors.
func (s *Supervisor) Start(name, bin, logPath string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	// The child keeps its own descriptor once started.
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = SysProcAttr()
	if err := s.spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &Process{name: name, logPath: logPath, cmd: cmd, started: time.Now(), done: make(chan struct{})}
	s.mu.Lock()
	s.live[p] = struct{}{}
	s.mu.Unlock()
	go s.reap(p)
	return p, nil
}

func (s *Supervisor) reap(p *Process) {
	err := p.cmd.Wait()
	p.mu.Lock()
	p.ended, p.err = time.Now(), err
	if p.forced > 0 {
		p.err = fmt.Errorf("%s did not stop within %s of SIGTERM: %w", p.name, p.forced, ErrGraceExpired)
	}
	if p.killer != nil {
		p.killer.Stop()
	}
	unexpected := !p.asked
	close(p.done)
	p.mu.Unlock()
	s.mu.Lock()
	delete(s.live, p)
	s.mu.Unlock()
	if unexpected && s.onUnexpected != nil {
		s.onUnexpected(fmt.Errorf("%s (pid %d) exited on its own (%s); the end of %s:\n%s",
			p.name, p.Pid(), ExitText(err), p.logPath, Tail(p.logPath, 20)))
	}
}

// StopAll stops every child still running at once (Stop) and ends the
// spawning thread; call it last, once or more.
func (s *Supervisor) StopAll(grace time.Duration) {
	s.mu.Lock()
	live := make([]*Process, 0, len(s.live))
	for p := range s.live {
		live = append(live, p)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range live {
		wg.Go(func() { _, _ = p.Stop(grace) })
	}
	wg.Wait()
	s.spawn.Close()
}

// Pid is the child's process id, also the id of its process group.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Started is when the child was started: before anything it did.
func (p *Process) Started() time.Time { return p.started }

// Running reports whether the child has not been reaped yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Wait waits for the child to end and says when and how: the error of its
// exit, or that Terminate's grace period ran out and it was killed.
func (p *Process) Wait() (time.Time, error) {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended, p.err
}

// signal sends sig to the child's process group; asked marks the exit that
// follows as expected.
func (p *Process) signal(sig syscall.Signal, asked bool) error {
	if asked {
		p.mu.Lock()
		p.asked = true
		p.mu.Unlock()
	}
	if err := SignalGroup(p.Pid(), sig); err != nil {
		return fmt.Errorf("sending %s to %s (pid %d): %w", sig, p.name, p.Pid(), err)
	}
	return nil
}

// Terminate asks the child to end (SIGTERM to its group, then SIGCONT, as a
// paused child handles SIGTERM only once it runs again) and kills the group
// if it has not ended grace later. It does not wait: Wait does.
func (p *Process) Terminate(grace time.Duration) error {
	if err := p.signal(syscall.SIGTERM, true); err != nil {
		return err
	}
	p.mu.Lock()
	if p.killer == nil && p.Running() {
		p.killer = time.AfterFunc(grace, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.Running() {
				p.forced = grace
				_ = SignalGroup(p.Pid(), syscall.SIGKILL)
			}
		})
	}
	p.mu.Unlock()
	return p.Resume()
}

// Stop is Terminate, then Wait; a child that already ended is only waited
// for.
func (p *Process) Stop(grace time.Duration) (time.Time, error) {
	if !p.Running() {
		return p.Wait()
	}
	if err := p.Terminate(grace); err != nil {
		return time.Time{}, err
	}
	return p.Wait()
}

// Kill crashes the child (SIGKILL to its group), as a node failure or the
// OOM killer would, and waits until it is gone.
func (p *Process) Kill() (time.Time, error) {
	if err := p.signal(syscall.SIGKILL, true); err != nil {
		return time.Time{}, err
	}
	<-p.done
	return p.ended, nil
}

// PeakRSS is the kernel's high-water mark of the child's resident memory
// (VmHWM), which catches the peaks between samples; false elsewhere than
// Linux, or once the child is gone.
func (p *Process) PeakRSS() (float64, bool) { return StatusBytes(p.Pid(), "VmHWM:") }

// StatusBytes reads one memory field of /proc/<pid>/status ("VmHWM:",
// "VmRSS:"), in bytes, of a child or of any process the run watches;
// false elsewhere than Linux, for pid 0, or once the process is gone.
func StatusBytes(pid int, field string) (float64, bool) {
	if pid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	return parseStatusBytes(string(b), field)
}

// parseStatusBytes finds a field given in kB in a /proc/<pid>/status, in
// bytes.
func parseStatusBytes(status, field string) (float64, bool) {
	for line := range strings.SplitSeq(status, "\n") {
		v, ok := strings.CutPrefix(line, field)
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}
