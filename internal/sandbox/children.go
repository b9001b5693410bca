package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
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
	// Kubeconfig and ConfigCenter (the config center's etcd client URL) are
	// what every replica connects to.
	Kubeconfig   string
	ConfigCenter string
	// SpiceDB and SpiceDBToken are the authorization system's address and
	// the file of its key.
	SpiceDB, SpiceDBToken string
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

// supervisor starts, stops and kills the replica processes through
// childproc's Supervisor, which makes sure none outlives the sandbox, and
// keeps what the sandbox last did to each, for the view.
type supervisor struct {
	opts     supervisorOptions
	replicas []*replica
	procs    *childproc.Supervisor
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

	mu    sync.Mutex
	state replicaState
	proc  *childproc.Process // the current process; nil before the first start
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
			"--config-center", "etcd", "--etcd-servers", opts.ConfigCenter,
			"--authorization", "spicedb", "--spicedb-endpoint", opts.SpiceDB, "--spicedb-token-file", opts.SpiceDBToken,
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
	s.procs = childproc.NewSupervisor(opts.OnUnexpected)
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
	p, err := s.procs.Start(r.id, s.opts.Executable, r.logPath, r.args...)
	if err != nil {
		return err
	}
	r.proc, r.state = p, stateRunning
	s.opts.Log.V(2).Info("Started replica", "replica", r.id, "pid", p.Pid())
	if s.opts.OnStarted != nil {
		s.opts.OnStarted(r.id, p.Pid())
	}
	go s.reap(r, p)
	return nil
}

// reap records how a replica's process ended (childproc's Supervisor
// reports an exit nobody asked for).
func (s *supervisor) reap(r *replica, p *childproc.Process) {
	_, err := p.Wait()
	r.mu.Lock()
	switch {
	case r.proc != p: // restarted since
	case r.state == stateRunning:
		r.state = stateExited
	case r.state == stateStopping:
		r.state = stateStopped
	}
	r.mu.Unlock()
	s.opts.Log.V(2).Info("Replica exited", "replica", r.id, "pid", p.Pid(), "err", err)
}

// terminate asks a replica to hand its shards over and exit (SIGTERM to its
// group); its group is killed if it did not end within the stop timeout. It
// does not wait: wait does.
func (s *supervisor) terminate(r *replica) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != stateRunning {
		return
	}
	r.state = stateStopping
	if err := r.proc.Terminate(s.opts.StopTimeout); err != nil {
		s.opts.Log.Error(err, "Stopping a replica", "replica", r.id)
	}
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
	p := r.proc
	r.mu.Unlock()
	_, err := p.Kill()
	return err
}

// wait waits for a replica's current process to end and says when and how
// it did. After terminate it never waits for more than the stop timeout plus
// the time SIGKILL takes.
func (r *replica) wait() (time.Time, error) {
	r.mu.Lock()
	p := r.proc
	r.mu.Unlock()
	if p == nil {
		return time.Time{}, nil
	}
	return p.Wait()
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

// close ends the spawning thread, after every replica stopped.
func (s *supervisor) close() { s.procs.StopAll(s.opts.StopTimeout) }

// status is a replica's state and, while it runs, its process id.
func (r *replica) status() (replicaState, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return r.state, 0
	}
	return r.state, r.proc.Pid()
}

func (r *replica) pid() int {
	_, pid := r.status()
	return pid
}
