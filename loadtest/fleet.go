package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/netfault"
)

// Mode is one way of running the controller: a name for the reports and the
// `kshard controller` flags that make it, appended after the load tester's
// own. A comparison is a list of modes run one after another on the same
// control plane and objects, so adding a column to one is adding a Mode.
type Mode struct {
	Name string
	Args []string
	// Plain runs cmd/plaincontroller, a controller-runtime controller
	// written without any kshard code, instead of `kshard controller`. It
	// gets only the load tester's flags it has (replicaArgs): no ring, no
	// StatefulSet, no audit log, and it exports no kshard_* metric.
	Plain bool
}

// The modes the comparisons use.
var (
	// ModeSharded is kshard as shipped: sharding on, external cache.
	ModeSharded = Mode{Name: "sharded", Args: []string{"--sharding=on", "--external-mode=cache"}}
	// ModeSingleton is the classic single active replica: leader election,
	// one cache of every object.
	ModeSingleton = Mode{Name: "sharding off", Args: []string{"--sharding=off", "--external-mode=cache"}}
	// ModeDirect calls the config center inside Reconcile, one call per key
	// per reconcile: the baseline of the external cache.
	ModeDirect = Mode{Name: "direct", Args: []string{"--sharding=on", "--external-mode=direct"}}
	// ModeCache is ModeSharded, named for the external comparison.
	ModeCache = Mode{Name: "cache", Args: ModeSharded.Args}
	// ModeMirror keeps values in ExternalDomain mirrors that each domain's
	// shard holder writes from the change feed.
	ModeMirror = Mode{Name: "mirror", Args: []string{"--sharding=on", "--external-mode=cache", "--external-source=mirror"}}
	// ModeAuthorized is ModeCache with every binding authorized by the
	// run's SpiceDB (--authorization=spicedb): the cost of asking an
	// authorization system, against ModeCache in the same run.
	ModeAuthorized = Mode{Name: "authorized", Args: []string{"--sharding=on", "--external-mode=cache", "--authorization=spicedb"}}
	// ModePlain is the floor of compare-sharding: cmd/plaincontroller, one
	// active replica by leader election, the manager's default cache of
	// everything, a synchronous config-center call per key per reconcile.
	ModePlain = Mode{Name: "plain controller-runtime", Plain: true}
)

// Sharded reports whether the mode runs the sharded ring (the default), as
// opposed to --sharding=off or the plain controller.
func (m Mode) Sharded() bool {
	if m.Plain {
		return false
	}
	for i, a := range m.Args {
		if a == "--sharding=off" || (a == "--sharding" && i+1 < len(m.Args) && m.Args[i+1] == "off") {
			return false
		}
	}
	return true
}

// hasArg reports whether the mode's arguments set flag to value.
func (m Mode) hasArg(flag, value string) bool {
	for i, a := range m.Args {
		if a == flag+"="+value || (a == flag && i+1 < len(m.Args) && m.Args[i+1] == value) {
			return true
		}
	}
	return false
}

// direct reports whether the mode calls the config center in Reconcile
// (--external-mode=direct): no external cache, no warm-up.
func (m Mode) direct() bool { return m.hasArg("--external-mode", "direct") }

// externalCache reports whether the mode's replicas keep an external cache
// (and export its metrics): not the plain controller, nor a replica that
// calls the config center in Reconcile.
func (m Mode) externalCache() bool { return !m.Plain && !m.direct() }

// authorized reports whether the mode's replicas ask SpiceDB whether a
// binding's namespace may read its domain.
func (m Mode) authorized() bool { return m.hasArg("--authorization", "spicedb") }

// readsCache reports whether Reconcile reads its values from the external
// cache, whose hit ratio is then a figure: not with ExternalDomain mirrors
// (--external-source=mirror), which it reads instead (the cache fills the
// mirrors, and is never looked up).
func (m Mode) readsCache() bool { return m.externalCache() && !m.hasArg("--external-source", "mirror") }

// fleet is the replicas of one mode, replica i being "kshard-i" as in a
// StatefulSet. Slots keep their identity and ports across restarts.
type fleet struct {
	r    *run
	mode Mode
	// id names the fleet in the run's metrics (their fleet label).
	id string
	// sizes are the replica counts the fleet was scaled to, in order
	// (stopping, 0, excluded).
	sizes []int

	mu    sync.Mutex
	slots []*slot

	// started is when the first replica started, stopped when the fleet
	// was told to stop; loadFrom and loadTo bound its measured phase.
	started, stopped, loadFrom, loadTo time.Time

	// startEvent is the fleet's start event: from its first process until every
	// object was reconciled by it and Ready at its latest generation.
	startEvent EventResult
	// startObjects is the number of objects when the start settled.
	startObjects int
	// tableDomains is the domains in the labeler's shard table when the
	// fleet started (-1: no table).
	tableDomains int
	// purpose says why a scenario runs the fleet, when its mode and size do
	// not (the scale scenario's first reconcile of new objects).
	purpose string

	// storm is the fleet's create storm: its start on existing objects, or
	// the scenario's creates while it ran.
	storm CreateStorm

	result *FleetResult
}

// slot is one replica identity; each (re)start is a new instance.
type slot struct {
	id          string
	metricsAddr string
	healthAddr  string
	// pprofAddr serves the replica's pprof endpoint with --profile; empty
	// otherwise.
	pprofAddr string
	// kubeconfig is the replica's own (its pod-bound token, fencing.go);
	// empty for the load tester's, which a replica with sharding off and
	// the plain controller use.
	kubeconfig string
	// proxy carries its requests to the API server where the chaos
	// scenario delays or cuts them (faultDelay, faultPartition); nil
	// otherwise.
	proxy *netfault.Proxy
	// clockOffset is the Lease clock offset its next process starts with
	// (--lease-clock-offset): set by the chaos scenario's clock fault, kept
	// until another fault restarts the replica.
	clockOffset time.Duration
	instances   []*instance
	// deleted is a pod's replica's instance whose pod the run deleted
	// last: the StatefulSet's next one replaces it.
	deleted *instance
}

// instance is one process of a replica, with what was sampled from it.
type instance struct {
	n    int
	proc replicaProcess
	// audit is the file of its audit records: its audit log, or its
	// container's log for a pod.
	audit string
	// metricsURL is where its metrics are read.
	metricsURL string
	// clockOffset is how far ahead of the machine's clock the times this
	// process writes into Leases are: the ring watch subtracts it.
	clockOffset time.Duration
	// pauses are the times the chaos scenario kept the process stopped;
	// paused says it is stopped now (it is not scraped then).
	pauses []window
	paused bool
	// cgroup names the process's cgroup of the CPU quota; "" without one.
	cgroup string
}

// replicaProcess is one process of a replica, whoever started it: a child
// process of the load tester (*childproc.Process) or a container of a
// StatefulSet's pod (container).
type replicaProcess interface {
	// Started is when it started: at or before its first Lease write.
	Started() time.Time
	Running() bool
	// Wait waits until it ended and says when, and how.
	Wait() (time.Time, error)
}

// window is a span of time; To is zero while it lasts.
type window struct {
	From, To time.Time
}

func (s *slot) current() *instance {
	if len(s.instances) == 0 {
		return nil
	}
	return s.instances[len(s.instances)-1]
}

func (s *slot) running() bool {
	in := s.current()
	return in != nil && in.proc.Running()
}

// label names the fleet in reports: "sharded ×3", or "sharded ×1→2→4"
// for a fleet that was scaled.
func (f *fleet) label() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	sizes := make([]string, 0, len(f.sizes))
	for _, n := range f.sizes {
		sizes = append(sizes, fmt.Sprint(n))
	}
	label := f.mode.Name + " ×" + strings.Join(sizes, "→")
	if f.purpose != "" {
		label += " (" + f.purpose + ")"
	}
	return label
}

// processOf is the newest process of replica id started at or before at,
// nil if none.
func (f *fleet) processOf(id string, at time.Time) *instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	var newest *instance
	for _, s := range f.slots {
		if s.id != id {
			continue
		}
		for _, in := range s.instances {
			if !in.proc.Started().After(at) && (newest == nil || in.proc.Started().After(newest.proc.Started())) {
				newest = in
			}
		}
	}
	return newest
}

// runningSlots lists the slots whose process runs.
func (f *fleet) runningSlots() []*slot {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*slot
	for _, s := range f.slots {
		if s.running() {
			out = append(out, s)
		}
	}
	return out
}

func (f *fleet) slot(i int) *slot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slots[i]
}

// size is the number of running replicas.
func (f *fleet) size() int { return len(f.runningSlots()) }

// scaleTo runs replicas 0..n-1 and stops the others, as `kubectl scale`
// would: the StatefulSet's desired count changes first, so a replica at or
// above it leaves the ring (hands over) instead of restarting.
func (f *fleet) scaleTo(ctx context.Context, n int) error {
	if f.r.pods != nil {
		return f.scalePods(ctx, n)
	}
	if err := f.r.setDesired(ctx, n); err != nil {
		return err
	}
	f.mu.Lock()
	f.noteSize(n)
	var added []*slot
	for len(f.slots) < n {
		ports, err := childproc.FreePorts(3)
		if err != nil {
			f.mu.Unlock()
			return err
		}
		i := len(f.slots)
		s := &slot{
			id:          fmt.Sprintf("%s-%d", StatefulSet, i),
			metricsAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]),
			healthAddr:  fmt.Sprintf("127.0.0.1:%d", ports[1]),
		}
		if f.r.opts.Profile {
			s.pprofAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
		}
		f.slots = append(f.slots, s)
		added = append(added, s)
	}
	slots := slices.Clone(f.slots)
	f.mu.Unlock()
	for _, s := range added {
		if err := f.connect(ctx, s); err != nil {
			return err
		}
	}
	if f.started.IsZero() {
		f.started = time.Now()
	}
	var stopping []*slot
	for i, s := range slots {
		switch {
		case i < n && !s.running():
			if err := f.start(s); err != nil {
				return err
			}
		case i >= n && s.running():
			stopping = append(stopping, s)
		}
	}
	// Scale-down stops the highest ordinal first, like a StatefulSet, but
	// does not wait for one before the next: the load tester measures the
	// handover of all of them together.
	var errs []error
	for _, s := range slices.Backward(stopping) {
		if _, err := s.current().proc.(*childproc.Process).Stop(f.r.opts.StopTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// noteSize records a size the fleet was scaled to. Caller holds f.mu.
func (f *fleet) noteSize(n int) {
	if n > 0 && (len(f.sizes) == 0 || f.sizes[len(f.sizes)-1] != n) {
		f.sizes = append(f.sizes, n)
	}
}

// scalePods scales the target StatefulSet to n and waits until replicas
// 0..n-1 each run a container and every other container ended: the
// StatefulSet controller starts and stops the pods, the kubelet the
// processes.
func (f *fleet) scalePods(ctx context.Context, n int) error {
	t := f.r.pods
	f.mu.Lock()
	f.noteSize(n)
	if f.started.IsZero() {
		f.started = time.Now()
	}
	f.mu.Unlock()
	if err := t.scale(ctx, n); err != nil {
		return err
	}
	return t.waitFor(ctx, f.r.opts.SettleTimeout, fmt.Sprintf("StatefulSet %s/%s running exactly %d replicas", t.namespace, t.name, n),
		func() bool { return f.runsExactly(n) })
}

// runsExactly says whether replicas 0..n-1 run, each one process, and no
// other does.
func (f *fleet) runsExactly(n int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.slots) < n {
		return false
	}
	for i, s := range f.slots {
		if (i < n) != s.running() {
			return false
		}
		for _, in := range s.instances {
			if in != s.current() && in.proc.Running() {
				return false
			}
		}
	}
	return true
}

// addContainer makes a container that started one more instance of its
// pod's replica.
func (f *fleet) addContainer(ordinal int, c *container) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.slots) <= ordinal {
		f.slots = append(f.slots, &slot{id: fmt.Sprintf("%s-%d", f.r.pods.name, len(f.slots))})
	}
	s := f.slots[ordinal]
	s.instances = append(s.instances, &instance{n: len(s.instances), proc: c, audit: c.logPath, metricsURL: c.metricsURL})
	f.r.log.V(1).Info("Replica container started", "replica", s.id, "container", c.id)
}

// connect gives a new slot its way to the API server. A sharded replica
// runs as deploy/base runs it, on a token of its own pod (r.fencing), and
// through a proxy of its own where the chaos scenario delays or cuts them;
// the others use the load tester's kubeconfig.
func (f *fleet) connect(ctx context.Context, s *slot) error {
	r := f.r
	if r.fencing == nil || !f.mode.Sharded() {
		return nil
	}
	server := ""
	if (r.faults.injects(faultDelay) || r.faults.injects(faultPartition)) && r.sc.Faults {
		p, err := netfault.Listen(r.apiAddr)
		if err != nil {
			return fmt.Errorf("the proxy of %s: %w", s.id, err)
		}
		r.faults.addProxy(p)
		s.proxy, server = p, p.Addr()
	}
	kubeconfig, err := r.fencing.kubeconfigFor(ctx, s.id, server)
	if err != nil {
		return err
	}
	s.kubeconfig = kubeconfig
	return nil
}

// start starts a new process instance of the slot.
func (f *fleet) start(s *slot) error {
	o := f.r.opts
	f.mu.Lock()
	in := &instance{n: len(s.instances), clockOffset: s.clockOffset}
	f.mu.Unlock()
	base := fmt.Sprintf("%s.%s.%d", strings.ReplaceAll(f.mode.Name, " ", "-"), s.id, in.n)
	bin := f.r.kshardBin
	if f.mode.Plain {
		if bin = f.r.plainBin; bin == "" {
			return fmt.Errorf("starting %s of %s: the scenario did not build plaincontroller (scenario.plain)", s.id, f.mode.Name)
		}
	} else {
		in.audit = filepath.Join(f.r.work, "audit", base+".jsonl")
	}
	limit := ""
	if b, _ := o.memoryLimitBytes(); b > 0 {
		limit = o.MemoryLimit
	}
	kubeconfig := s.kubeconfig
	if kubeconfig == "" {
		kubeconfig = f.r.kubeconfig
	}
	args := replicaArgs(f.mode, replicaConfig{
		kubeconfig: kubeconfig, id: s.id, center: f.r.center.args(), authorization: f.r.authz.argsFor(f.mode),
		metricsAddr: s.metricsAddr, healthAddr: s.healthAddr, audit: in.audit,
		leaseDuration: o.LeaseDuration, renewDeadline: o.RenewDeadline, retryPeriod: o.RetryPeriod, shards: o.Shards,
		memoryLimit: limit, clockOffset: in.clockOffset,
		pprofAddr: s.pprofAddr, extra: o.ReplicaArgs,
	})
	if q := f.r.cpuQuota; q != nil {
		var err error
		if in.cgroup, bin, args, err = q.command(base, bin, args); err != nil {
			return err
		}
	}
	p, err := f.r.procs.Start(s.id, bin, filepath.Join(f.r.work, "logs", base+".log"), args...)
	if err != nil {
		return err
	}
	in.proc, in.metricsURL = p, "http://"+s.metricsAddr+"/metrics"
	f.mu.Lock()
	s.instances = append(s.instances, in)
	f.mu.Unlock()
	f.r.log.V(1).Info("Started replica", "replica", s.id, "mode", f.mode.Name, "pid", p.Pid())
	return nil
}

// replicaConfig is what the load tester tells every replica process.
type replicaConfig struct {
	kubeconfig, id, metricsAddr, healthAddr string
	// center are the flags pointing it at the config center (center.args),
	// authorization those pointing an authorized mode at the run's SpiceDB
	// (authorization.argsFor).
	center, authorization []string
	// audit is the audit log's path; empty for a plain mode, which has
	// none.
	audit                                     string
	leaseDuration, renewDeadline, retryPeriod time.Duration
	// shards is --shards, which a plain mode, having no ring, does not get.
	shards int32
	// memoryLimit is --memory-limit, empty for none; clockOffset is
	// --lease-clock-offset, a fault. Neither reaches a plain mode, which has
	// no such flag.
	memoryLimit string
	clockOffset time.Duration
	// pprofAddr is --pprof-bind-address (empty: none), which the plain
	// controller has too; extra are flags appended last
	// (Options.ReplicaArgs), which do not reach a plain mode.
	pprofAddr string
	extra     []string
}

// replicaArgs is the command line of one replica process of the mode:
// `kshard controller` with the load tester's flags and then the mode's, or
// for a plain mode only the flags cmd/plaincontroller has (the same names
// and meanings; it has no ring, StatefulSet or audit log, and would refuse
// an unknown flag rather than ignore it).
func replicaArgs(mode Mode, c replicaConfig) []string {
	common := []string{
		"--kubeconfig", c.kubeconfig,
		"--replica-id", c.id,
		"--lease-namespace", LeaseNamespace,
		"--metrics-bind-address", c.metricsAddr,
		"--health-probe-bind-address", c.healthAddr,
		"--lease-duration", c.leaseDuration.String(),
		"--renew-deadline", c.renewDeadline.String(),
		"--retry-period", c.retryPeriod.String(),
		"--zap-log-level=info",
	}
	common = append(common, c.center...)
	if c.pprofAddr != "" {
		common = append(common, "--pprof-bind-address", c.pprofAddr)
	}
	if mode.Plain {
		return append(common, mode.Args...)
	}
	args := append([]string{"controller"}, common...)
	args = append(args,
		"--ring", Ring,
		"--shards", strconv.Itoa(int(c.shards)),
		"--statefulset", StatefulSet,
		"--audit-log", c.audit,
	)
	if c.memoryLimit != "" {
		args = append(args, "--memory-limit", c.memoryLimit)
	}
	if c.clockOffset != 0 {
		// "=" keeps a negative offset from reading as a flag.
		args = append(args, "--lease-clock-offset="+c.clockOffset.String())
	}
	args = append(args, mode.Args...)
	args = append(args, c.authorization...)
	// Last, so that a flag given twice takes this value.
	return append(args, c.extra...)
}

// restart starts a stopped or crashed replica again, same identity, its
// Lease clock offset by offset (0 for none). A pod's replica the
// StatefulSet restarts by itself: restart waits until it runs again.
func (f *fleet) restart(ctx context.Context, s *slot, offset time.Duration) error {
	if f.r.pods != nil {
		return f.awaitNewContainer(ctx, s)
	}
	if s.running() {
		return fmt.Errorf("restarting %s: it is running", s.id)
	}
	f.mu.Lock()
	s.clockOffset = offset
	f.mu.Unlock()
	return f.start(s)
}

// awaitNewContainer waits until a pod's replica runs a container that
// started after its current one (the StatefulSet recreates a deleted pod;
// the kubelet starts its container).
func (f *fleet) awaitNewContainer(ctx context.Context, s *slot) error {
	return f.r.pods.waitFor(ctx, f.r.opts.SettleTimeout, s.id+" running again", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return s.current() != s.deleted && s.running()
	})
}

// deletePod deletes the pod of a replica, forced or with its grace period,
// and remembers which instance it ends.
func (f *fleet) deletePod(ctx context.Context, s *slot, force bool) error {
	f.mu.Lock()
	s.deleted = s.current()
	f.mu.Unlock()
	return f.r.pods.deletePod(ctx, s.id, force)
}

// childProcess is a slot's current process, for the faults that signal it.
func (s *slot) childProcess(what string) (*instance, *childproc.Process, error) {
	in := s.current()
	if in == nil || !in.proc.Running() {
		return nil, nil, fmt.Errorf("%s %s: not running", what, s.id)
	}
	p, ok := in.proc.(*childproc.Process)
	if !ok {
		return nil, nil, fmt.Errorf("%s %s: a pod's container cannot be signalled by the load tester", what, s.id)
	}
	return in, p, nil
}

// pause stops a replica's process (SIGSTOP) until resume, and returns when
// the signal was sent.
func (f *fleet) pause(s *slot) (time.Time, error) {
	in, p, err := s.childProcess("pausing")
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	f.mu.Lock()
	in.paused = true
	in.pauses = append(in.pauses, window{From: at})
	f.mu.Unlock()
	return at, p.Pause()
}

// resume lets a paused replica's process run again (SIGCONT).
func (f *fleet) resume(s *slot) error {
	in := s.current()
	if in == nil {
		return fmt.Errorf("resuming %s: no process", s.id)
	}
	p, ok := in.proc.(*childproc.Process)
	if !ok {
		return fmt.Errorf("resuming %s: not a child process", s.id)
	}
	err := p.Resume()
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(in.pauses); in.paused && n > 0 {
		in.pauses[n-1].To = time.Now()
	}
	in.paused = false
	return err
}

// pauseWindows lists, per replica, the times its processes were paused.
func (f *fleet) pauseWindows() map[string][]window {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]window{}
	for _, s := range f.slots {
		for _, in := range s.instances {
			out[s.id] = append(out[s.id], in.pauses...)
		}
	}
	return out
}

// kill crashes a replica with SIGKILL and returns when it is gone. A pod's
// replica is deleted at once instead (`kubectl delete pod --grace-period=0
// --force`), and kill returns when the deletion was sent: the kubelet still
// gives the process a SIGTERM and 2 s, which the load tester cannot skip.
func (f *fleet) kill(ctx context.Context, s *slot) (time.Time, error) {
	if f.r.pods != nil {
		at := time.Now()
		return at, f.deletePod(ctx, s, true)
	}
	_, p, err := s.childProcess("killing")
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	_, err = p.Kill()
	return at, err
}

// terminate sends SIGTERM and waits for the replica to exit, returning when
// the signal was sent. A pod's replica is deleted with its grace period
// instead.
func (f *fleet) terminate(ctx context.Context, s *slot) (time.Time, error) {
	in := s.current()
	if in == nil || !in.proc.Running() {
		return time.Time{}, fmt.Errorf("stopping %s: not running", s.id)
	}
	at := time.Now()
	if f.r.pods == nil {
		if err := in.proc.(*childproc.Process).Terminate(f.r.opts.StopTimeout); err != nil {
			return at, err
		}
		if _, err := in.proc.Wait(); errors.Is(err, childproc.ErrGraceExpired) {
			return at, err
		}
		return at, nil
	}
	if err := f.deletePod(ctx, s, false); err != nil {
		return at, err
	}
	done := make(chan struct{})
	go func() { defer close(done); _, _ = in.proc.Wait() }()
	select {
	case <-done:
		return at, nil
	case <-time.After(f.r.opts.StopTimeout):
		return at, fmt.Errorf("%s did not stop within %s of its deletion", s.id, f.r.opts.StopTimeout)
	}
}

// auditFiles lists every instance's audit log, with when each process
// ended.
func (f *fleet) auditFiles() []auditFile {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []auditFile
	for _, s := range f.slots {
		for _, in := range s.instances {
			if in.audit == "" {
				continue // a plain replica writes no audit log
			}
			af := auditFile{Path: in.audit, Replica: s.id}
			if !in.proc.Running() {
				af.Ended, _ = in.proc.Wait()
			}
			if _, err := os.Stat(in.audit); err == nil {
				out = append(out, af)
			}
		}
	}
	return out
}

// auditPaths lists the audit logs of the running instances.
func (f *fleet) auditPaths() []string {
	var out []string
	for _, s := range f.runningSlots() {
		if a := s.current().audit; a != "" {
			out = append(out, a)
		}
	}
	return out
}
