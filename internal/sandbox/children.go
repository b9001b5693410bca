package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/kshard/kshard/internal/childproc"
)

// supervisorOptions say how to run the replica processes.
type supervisorOptions struct {
	// Executable is the kshard binary.
	Executable string
	// Dir receives one log file per replica.
	Dir string
	// Kubeconfig and ConfigCenter are what every replica connects to.
	Kubeconfig   string
	ConfigCenter string
	// Replicas is how many replicas there are: kshard-0..Replicas-1.
	Replicas int
	// StopTimeout bounds a graceful stop before SIGKILL.
	StopTimeout time.Duration
	// LeaseDuration, RenewDeadline and RetryPeriod are passed to every replica.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Shards, when set, is every replica's --shards.
	Shards int
	// OnStarted is told every process started (tests check they are gone).
	OnStarted func(replica string, pid int)
	// OnUnexpected is told when a replica exits without being asked to, so
	// the run fails at once instead of at the next step's timeout.
	OnUnexpected func(error)
	Log          logr.Logger
}

// supervisor starts, stops and kills the replica processes, and makes sure
// none outlives the sandbox.
//
// Each replica runs in its own process group: a Ctrl-C at the terminal goes
// to the foreground group only, so the sandbox, not the terminal, decides the
// order of shutdown (replicas hand over while the API server still runs), and
// signalling the group reaches anything a replica started. On Linux each
// replica also gets SIGKILL from the kernel if the thread that started it
// dies (Pdeathsig), the last line of defence when the sandbox itself is
// killed or crashes in a way no deferred cleanup survives.
type supervisor struct {
	opts     supervisorOptions
	replicas []*replica
	spawn    *childproc.Spawner
}

// replicaState is what the sandbox last did to a replica, so an exit can be
// told apart from a crash and the view can say what is going on.
type replicaState string

const (
	stateRunning  replicaState = "running"
	stateStopping replicaState = "stopping"
	stateStopped  replicaState = "stopped"
	stateKilled   replicaState = "killed"
	stateExited   replicaState = "exited" // on its own: a failure
)

// replica is one replica process slot; it is restarted in place.
type replica struct {
	id          string
	metricsAddr string
	healthAddr  string
	logPath     string
	args        []string

	mu      sync.Mutex
	state   replicaState
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed once the current process was reaped
	exitErr error
	killer  *time.Timer // SIGKILL after a stop's grace period
	forced  bool        // the killer fired
	ended   time.Time   // when the current process was reaped
}

func newSupervisor(opts supervisorOptions) (*supervisor, error) {
	ports, err := childproc.FreePorts(2 * opts.Replicas)
	if err != nil {
		return nil, err
	}
	s := &supervisor{opts: opts}
	for i := range opts.Replicas {
		r := &replica{
			id:          fmt.Sprintf("kshard-%d", i),
			metricsAddr: fmt.Sprintf("127.0.0.1:%d", ports[2*i]),
			healthAddr:  fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
			state:       stateStopped,
		}
		r.logPath = filepath.Join(opts.Dir, r.id+".log")
		r.args = []string{"controller",
			"--kubeconfig", opts.Kubeconfig,
			"--replica-id", r.id,
			"--ring", Ring,
			"--lease-namespace", LeaseNamespace,
			"--configcenter-url", opts.ConfigCenter,
			"--metrics-bind-address", r.metricsAddr,
			"--health-probe-bind-address", r.healthAddr,
			"--lease-duration", opts.LeaseDuration.String(),
			"--renew-deadline", opts.RenewDeadline.String(),
			"--retry-period", opts.RetryPeriod.String(),
			"--zap-log-level=info",
		}
		if opts.Shards > 0 {
			r.args = append(r.args, "--shards", fmt.Sprint(opts.Shards))
		}
		// A fresh log per run; restarts append to it.
		if err := os.WriteFile(r.logPath, nil, 0o644); err != nil {
			return nil, fmt.Errorf("creating the log of %s: %w", r.id, err)
		}
		s.replicas = append(s.replicas, r)
	}
	s.spawn = childproc.NewSpawner()
	return s, nil
}

func (s *supervisor) all() []*replica { return s.replicas }

func (s *supervisor) get(id string) *replica {
	for _, r := range s.replicas {
		if r.id == id {
			return r
		}
	}
	return nil
}

// running lists the replicas whose process is alive (running or stopping).
func (s *supervisor) running() []*replica {
	var out []*replica
	for _, r := range s.replicas {
		if st, _ := r.status(); st == stateRunning || st == stateStopping {
			out = append(out, r)
		}
	}
	return out
}

// start starts (or restarts) a replica's process.
func (s *supervisor) start(r *replica) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == stateRunning || r.state == stateStopping {
		return fmt.Errorf("starting %s: already running", r.id)
	}
	logFile, err := os.OpenFile(r.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("opening the log of %s: %w", r.id, err)
	}
	// The child has its own copy of the descriptor once started.
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s: %s %s\n", time.Now().Format(time.RFC3339), s.opts.Executable, strings.Join(r.args, " "))

	cmd := exec.Command(s.opts.Executable, r.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = childproc.SysProcAttr()
	if err := s.spawn.Start(cmd); err != nil {
		return fmt.Errorf("starting %s (%s): %w", r.id, s.opts.Executable, err)
	}
	r.cmd, r.state, r.started, r.exitErr, r.forced = cmd, stateRunning, time.Now(), nil, false
	done := make(chan struct{})
	r.done = done
	s.opts.Log.V(2).Info("Started replica", "replica", r.id, "pid", cmd.Process.Pid)
	if s.opts.OnStarted != nil {
		s.opts.OnStarted(r.id, cmd.Process.Pid)
	}
	go s.reap(r, cmd, done)
	return nil
}

// reap waits for a replica's process, records how it ended, and reports an
// exit nobody asked for.
func (s *supervisor) reap(r *replica, cmd *exec.Cmd, done chan struct{}) {
	err := cmd.Wait()
	r.mu.Lock()
	r.exitErr, r.ended = err, time.Now()
	if r.forced {
		r.exitErr = fmt.Errorf("did not stop within %s after SIGTERM: killed", s.opts.StopTimeout)
	}
	if r.killer != nil {
		r.killer.Stop()
		r.killer = nil
	}
	unexpected := r.state == stateRunning
	switch r.state {
	case stateRunning:
		r.state = stateExited
	case stateStopping:
		r.state = stateStopped
	}
	close(done)
	r.mu.Unlock()
	s.opts.Log.V(2).Info("Replica exited", "replica", r.id, "pid", cmd.Process.Pid, "err", err)
	if unexpected && s.opts.OnUnexpected != nil {
		s.opts.OnUnexpected(fmt.Errorf("replica %s (pid %d) exited on its own (%v); the end of %s:\n%s",
			r.id, cmd.Process.Pid, childproc.ExitText(err), shown(r.logPath), childproc.Tail(r.logPath, 20)))
	}
}

// terminate asks a replica to hand its shards over and exit (SIGTERM to its
// group), and arms a SIGKILL of the group after the grace period. It does not
// wait: wait does.
func (s *supervisor) terminate(r *replica) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != stateRunning {
		return
	}
	r.state = stateStopping
	pid := r.cmd.Process.Pid
	if err := childproc.SignalGroup(pid, syscall.SIGTERM); err != nil {
		s.opts.Log.Error(err, "Sending SIGTERM", "replica", r.id, "pid", pid)
	}
	r.killer = time.AfterFunc(s.opts.StopTimeout, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.state == stateStopping && r.killer != nil {
			s.opts.Log.Info("Replica did not stop in time: killing it", "replica", r.id, "pid", pid, "timeout", s.opts.StopTimeout)
			r.forced = true
			_ = childproc.SignalGroup(pid, syscall.SIGKILL)
		}
	})
}

// kill crashes a replica (SIGKILL to its group), as a node failure or the
// OOM killer would, and waits until the process is gone.
func (s *supervisor) kill(r *replica) error {
	r.mu.Lock()
	if r.state != stateRunning && r.state != stateStopping {
		r.mu.Unlock()
		return nil
	}
	r.state = stateKilled
	pid, done := r.cmd.Process.Pid, r.done
	err := childproc.SignalGroup(pid, syscall.SIGKILL)
	r.mu.Unlock()
	if err != nil {
		return fmt.Errorf("killing %s (pid %d): %w", r.id, pid, err)
	}
	<-done
	return nil
}

// wait waits for a replica's current process to end and says when and how
// it did. After terminate it never waits for more than the stop timeout plus
// the time SIGKILL takes.
func (r *replica) wait() (time.Time, error) {
	r.mu.Lock()
	done := r.done
	r.mu.Unlock()
	if done == nil {
		return time.Time{}, nil
	}
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended, r.exitErr
}

// stopResult is how one replica ended when the sandbox stopped.
type stopResult struct {
	id  string
	err error
}

// stopAll stops every live replica at once and waits for all of them.
func (s *supervisor) stopAll() []stopResult {
	live := s.running()
	for _, r := range live {
		s.terminate(r)
	}
	out := make([]stopResult, 0, len(live))
	for _, r := range live {
		_, err := r.wait()
		out = append(out, stopResult{id: r.id, err: err})
	}
	return out
}

// close ends the spawner thread, after every replica stopped.
func (s *supervisor) close() { s.spawn.Close() }

// status is a replica's state and, while it runs, its process id.
func (r *replica) status() (replicaState, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil || r.cmd.Process == nil {
		return r.state, 0
	}
	return r.state, r.cmd.Process.Pid
}

func (r *replica) pid() int {
	_, pid := r.status()
	return pid
}
