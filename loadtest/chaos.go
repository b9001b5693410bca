package loadtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/netfault"
)

// faultKind is one kind of fault the chaos scenario injects.
type faultKind int

const (
	// faultKill crashes the victim (SIGKILL) and starts it again after the
	// restart delay with the same identity, as a StatefulSet would. Its
	// shards wait for their Leases to expire.
	faultKill faultKind = iota
	// faultPause stops the victim (SIGSTOP) for longer than its Leases last,
	// then lets it go on (SIGCONT): a long GC pause, CPU throttling, a
	// frozen VM. Another replica takes its shards over meanwhile; the
	// victim, which cannot notice, must not write once it has.
	faultPause
	// faultClock restarts the victim (SIGTERM, then a new process) with the
	// times it writes into Leases shifted (--lease-clock-offset): a node
	// whose time sync failed. Expiry is timed on each replica's monotonic
	// clock, so nothing may change: no shard taken early from a replica
	// whose renewals look old, none left waiting on one whose look new.
	faultClock
	// faultDelay holds what the victim sends to the API server for longer
	// than its Leases last (its connection goes through a netfault.Proxy),
	// then delivers it: a network that heals late, a request already sent
	// when the process stalled. Its writes passed its own fence
	// (WriteContext) when they left and arrive after its Leases expired and
	// other replicas took its shards over: only the API server can refuse
	// them (deploy/base's kshard-shard-writes policy), and the write check
	// reads from its audit log whether it committed any. Replica processes
	// only.
	faultDelay
	// faultPartition cuts the victim from the API server both ways for
	// DelayFor (its connection goes through a netfault.Proxy), then heals
	// with its connections open: what it sent arrives late, as with a
	// delay, and it hears nothing meanwhile, not even its renewals'
	// answers, as a replica whose node lost its network. On a StatefulSet's
	// pods, with Options.NodeFaults, the pod's veth goes down instead.
	faultPartition
	// faultAPIServerRestart restarts the kube-apiserver of the control
	// plane the load tester started (SIGTERM, then the same command line):
	// every replica's connections and watches break at once, and each must
	// resume or relist once per informer, not storm. The victim is none in
	// particular. On the load tester's own control plane, or on a node
	// whose Options.NodeFaults can restart it.
	faultAPIServerRestart
	// faultForceDelete deletes the victim's pod at once (`kubectl delete
	// pod --grace-period=0 --force`): the pod object goes, the kubelet still
	// stops the container with SIGTERM and 2 s of grace, and the StatefulSet
	// recreates the pod meanwhile. Pods only.
	faultForceDelete
	// faultDelete deletes the victim's pod with its grace period, as
	// `kubectl delete pod` or a node drain does: the replica hands its
	// shards over and the StatefulSet recreates it. Pods only.
	faultDelete
)

func (k faultKind) String() string {
	return [...]string{"kill", "pause", "clock offset", "delay", "partition", "API server restart", "forced pod deletion", "pod deletion"}[k]
}

// faultNames name the fault kinds in Options.Faults.
var faultNames = map[string]faultKind{
	"kill": faultKill, "pause": faultPause, "clock": faultClock, "delay": faultDelay,
	"partition": faultPartition, "apiserver-restart": faultAPIServerRestart,
	"force-delete": faultForceDelete, "delete": faultDelete,
}

// faultRotation is the order of the chaos scenario's faults, one per
// interval, on replica processes.
var faultRotation = []faultKind{faultKill, faultPause, faultClock, faultDelay, faultPartition, faultAPIServerRestart}

// podFaultRotation is the order on a StatefulSet's pods, which the load
// tester can delete but not signal; nodeFaultRotation adds the faults of
// the node's network and control plane that Options.NodeFaults injects.
var (
	podFaultRotation  = []faultKind{faultForceDelete, faultDelete}
	nodeFaultRotation = []faultKind{faultForceDelete, faultDelete, faultDelay, faultPartition, faultAPIServerRestart}
)

// parseFaults reads Options.Faults: the rotation, of the kinds the target
// allows (pods: deletions, and with node faults a delay, a partition and an
// API server restart); the target's whole rotation for "".
func parseFaults(s string, pods, node bool) ([]faultKind, error) {
	allowed := faultRotation
	switch {
	case pods && node:
		allowed = nodeFaultRotation
	case pods:
		allowed = podFaultRotation
	}
	if s == "" {
		return allowed, nil
	}
	var out []faultKind
	for _, name := range strings.Split(s, ",") {
		k, ok := faultNames[strings.TrimSpace(name)]
		if !ok || !slices.Contains(allowed, k) {
			names := make([]string, 0, len(allowed))
			for n, k := range faultNames {
				if slices.Contains(allowed, k) {
					names = append(names, n)
				}
			}
			slices.Sort(names)
			return nil, fmt.Errorf("fault %q must be one of %s (on %s)", name, strings.Join(names, ", "), map[bool]string{true: "a StatefulSet's pods", false: "replica processes"}[pods])
		}
		out = append(out, k)
	}
	return out, nil
}

// fault is one fault to inject.
type fault struct {
	kind faultKind
	// offset is a clock fault's Lease clock offset.
	offset time.Duration
}

// lasts is how long the fault keeps its victim from running normally
// before it is restarted or resumed: the restart delay of a kill, the
// pause; a clock fault restarts at once.
func (f fault) lasts(o Options) time.Duration {
	switch f.kind {
	case faultKill:
		return o.RestartDelay
	case faultPause:
		return o.PauseFor
	case faultDelay, faultPartition:
		return o.DelayFor
	}
	return 0
}

// faultPlan hands out the chaos scenario's faults in rotation, the clock
// faults' offsets ahead of the machine's clock and behind it in turn.
type faultPlan struct {
	rotation []faultKind
	offset   time.Duration
	n        int
	clocks   int
}

func (p *faultPlan) next() fault {
	f := fault{kind: p.rotation[p.n%len(p.rotation)]}
	p.n++
	if f.kind == faultClock {
		f.offset = p.offset
		if p.clocks%2 == 1 {
			f.offset = -p.offset
		}
		p.clocks++
	}
	return f
}

// signed writes an offset with its sign: +30s, -30s.
func signed(d time.Duration) string {
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

// faults injects faults into a fleet: the chaos scenario's rotation, and
// the scale scenario's API server restarts. It keeps what the evidence
// must excuse or count of them: the windows that held a replica's requests
// on the wire, the API server's restarts, and the proxies that hold them.
type faults struct {
	r *run
	// rotation is the chaos scenario's order of faults (Options.Faults).
	rotation []faultKind

	mu       sync.Mutex
	held     []heldWindow
	restarts []apiServerRestart
	proxies  []*netfault.Proxy
}

// newFaults is the faults of a run: Options.Faults' rotation on the
// target's fault kinds; on a cluster of the user's, without an API server
// restart unless the node's fault command can make one.
func newFaults(r *run) *faults {
	o := r.opts
	rotation, _ := parseFaults(o.Faults, o.StatefulSet != "", o.NodeFaults != "") // validated by setDefaults
	if o.Faults == "" && o.Kubeconfig != "" && o.NodeFaults == "" {
		rotation = slices.DeleteFunc(rotation, func(k faultKind) bool { return k == faultAPIServerRestart })
	}
	return &faults{r: r, rotation: rotation}
}

// injects says whether the chaos scenario's rotation has a fault of kind.
func (fs *faults) injects(kind faultKind) bool {
	return slices.Contains(fs.rotation, kind)
}

// addProxy keeps a replica's proxy to the API server, to close it at the
// end of the run.
func (fs *faults) addProxy(p *netfault.Proxy) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.proxies = append(fs.proxies, p)
}

// record is what the faults held and restarted so far, for the evidence.
func (fs *faults) record() ([]heldWindow, []apiServerRestart) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return slices.Clone(fs.held), slices.Clone(fs.restarts)
}

// run injects a fault on a random running replica every chaos
// interval, in rotation, until the duration ends, each settled before the
// next interval counts.
func (fs *faults) run(ctx context.Context, f *fleet) error {
	r := fs.r
	rng := rand.New(rand.NewPCG(r.opts.Seed, 7))
	plan := faultPlan{rotation: fs.rotation, offset: r.opts.ClockOffset}
	var done []injected
	defer func() { r.report.addFinding(faultsFinding(plan.rotation, done)) }()
	end := time.Now().Add(r.opts.Duration)
	for {
		ft := plan.next()
		next := time.Now().Add(r.opts.ChaosInterval)
		if next.Add(ft.lasts(r.opts)).After(end) {
			return nil
		}
		if err := sleep(ctx, time.Until(next)); err != nil {
			return err
		}
		victims := f.runningSlots()
		if len(victims) == 0 {
			return fmt.Errorf("no replica runs")
		}
		s := victims[rng.IntN(len(victims))]
		in := injected{fault: ft, replica: s.id, at: time.Since(r.begin)}
		if err := fs.inject(ctx, f, s, ft); err != nil {
			return err
		}
		done = append(done, in)
	}
}

// injected is a fault that ran: on which replica, and when into the run.
type injected struct {
	fault
	replica string
	at      time.Duration
}

func (i injected) String() string {
	s := fmt.Sprintf("%s of %s at %s", i.kind, i.replica, round(i.at))
	switch i.kind {
	case faultAPIServerRestart:
		s = fmt.Sprintf("%s at %s", i.kind, round(i.at))
	case faultClock:
		s = fmt.Sprintf("%s %s on %s at %s", i.kind, signed(i.offset), i.replica, round(i.at))
	}
	return s
}

// inject runs one fault on replica s and waits for the fleet to settle
// after it (a handover under load, from the fault's signal).
func (fs *faults) inject(ctx context.Context, f *fleet, s *slot, ft fault) error {
	r := fs.r
	// The relist window of an API server restart ends before the next
	// fault, whose recovery may sync caches of its own.
	fs.closeRestartWindow(ctx)
	switch ft.kind {
	case faultForceDelete, faultDelete:
		return fs.deletePod(ctx, f, s, ft.kind == faultForceDelete)
	case faultKill:
		return fs.killAndRestart(ctx, f, s)
	case faultPause:
		return fs.pauseAndResume(ctx, f, s)
	case faultDelay, faultPartition:
		if r.pods != nil {
			return fs.podNetworkFault(ctx, f, s, ft.kind)
		}
		return fs.holdRequests(ctx, f, s, ft.kind)
	case faultAPIServerRestart:
		return fs.restartAPIServer(ctx, f)
	case faultClock:
		r.mark("SIGTERM %s", s.id)
		at, err := f.terminate(ctx, s)
		if err != nil {
			return err
		}
		r.mark("start %s, Lease clock %s", s.id, signed(ft.offset))
		if err := f.restart(ctx, s, ft.offset); err != nil {
			return err
		}
		r.handover(ctx, f, fmt.Sprintf("restart of %s with its Lease clock %s (--lease-clock-offset)", s.id, signed(ft.offset)), at)
		return nil
	}
	return fmt.Errorf("unknown fault %d", ft.kind)
}

// deletePod deletes the replica's pod, forced (grace 0) or with its grace
// period, and waits for the StatefulSet's new one. A forced deletion
// returns at once, a graceful one when the container ended.
func (fs *faults) deletePod(ctx context.Context, f *fleet, s *slot, force bool) error {
	r := fs.r
	deletePod, verb, event := f.terminate, "delete", "deletion of pod %s (its grace period)"
	if force {
		deletePod, verb, event = f.kill, "force-delete", "forced deletion of pod %s (grace 0)"
	}
	r.mark("%s pod %s", verb, s.id)
	at, err := deletePod(ctx, s)
	if err == nil {
		err = f.restart(ctx, s, 0)
	}
	if err != nil {
		return err
	}
	r.handover(ctx, f, fmt.Sprintf(event+", recreated by the StatefulSet", s.id), at)
	return nil
}

// killAndRestart crashes the replica (SIGKILL) and starts it again after
// the restart delay.
func (fs *faults) killAndRestart(ctx context.Context, f *fleet, s *slot) error {
	r := fs.r
	r.mark("SIGKILL %s", s.id)
	at, err := f.kill(ctx, s)
	if err != nil {
		return err
	}
	if err := sleep(ctx, r.opts.RestartDelay); err != nil {
		return err
	}
	// A restart by another fault ends a clock offset.
	r.mark("restart %s", s.id)
	if err := f.restart(ctx, s, 0); err != nil {
		return err
	}
	r.handover(ctx, f, fmt.Sprintf("crash of %s, restarted after %s", s.id, r.opts.RestartDelay), at)
	return nil
}

// pauseAndResume stops the replica (SIGSTOP) for PauseFor, then continues
// it.
func (fs *faults) pauseAndResume(ctx context.Context, f *fleet, s *slot) error {
	r := fs.r
	r.mark("SIGSTOP %s", s.id)
	at, err := f.pause(s)
	if err == nil {
		err = sleep(ctx, r.opts.PauseFor)
	}
	// Resumed on every way out: a stopped child would not stop. It keeps
	// running, labeler or not: sharding's own labeler election stops only
	// the labeling when it is lost, so an exit fails the run.
	r.mark("SIGCONT %s", s.id)
	if rerr := f.resume(s); err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	r.handover(ctx, f, fmt.Sprintf("pause of %s (SIGSTOP for %s, then SIGCONT)", s.id, r.opts.PauseFor), at)
	return nil
}

// restartAPIServer restarts the API server the load tester started
// and waits for the fleet to settle, reading Leases directly meanwhile.
func (fs *faults) restartAPIServer(ctx context.Context, f *fleet) error {
	r := fs.r
	if fs.r.restartAPIServer == nil {
		return errors.New("restarting the API server: the load tester did not start it (--kubeconfig)")
	}
	r.mark("restart the API server")
	// Leases read directly until the fleet settled: the ring watch's own
	// reconnection lags the replicas'.
	stopPoll := r.ring.poll(ctx)
	defer stopPoll()
	at := time.Now()
	if err := fs.r.restartAPIServer(ctx); err != nil {
		return err
	}
	ready := time.Now()
	r.handover(ctx, f, fmt.Sprintf("restart of the API server (SIGTERM, then the same command line), ready again after %s", round(ready.Sub(at))), at)
	stopPoll()
	fs.noteRestart(apiServerRestart{At: at, Ready: ready, Settled: time.Now()})
	return nil
}

// faultsFinding says which faults ran, so a report shows whether each kind
// did within the duration.
func faultsFinding(rotation []faultKind, done []injected) string {
	count := map[faultKind]int{}
	each := make([]string, 0, len(done))
	for _, d := range done {
		count[d.kind]++
		each = append(each, d.String())
	}
	kinds := make([]string, 0, len(rotation))
	for _, k := range rotation {
		kinds = append(kinds, fmt.Sprintf("%d %s", count[k], k))
	}
	s := "faults injected: " + strings.Join(kinds, ", ")
	if len(each) > 0 {
		s += " (" + strings.Join(each, "; ") + ")"
	}
	return s
}

// heldWindow is one fault that held a victim's requests on the wire (a
// delay or a partition): its kind, its victim, and when it began.
type heldWindow struct {
	kind    faultKind
	replica string
	from    time.Time
}

// noteHeld records a delay or partition fault, for the write evidence:
// either holds the victim's writes on the wire.
func (fs *faults) noteHeld(kind faultKind, replica string, from time.Time) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.held = append(fs.held, heldWindow{kind: kind, replica: replica, from: from})
}

// heldFault says how a fault that holds a replica process's connection to
// the API server at its proxy does it, and how the run names it.
var heldFault = map[faultKind]struct {
	hold                 func(p *netfault.Proxy, d time.Duration)
	mark, nothing, event string
}{
	faultDelay: {
		hold:    (*netfault.Proxy).Delay,
		mark:    "delay what %s sends to the API server by %s",
		nothing: "the delay fault held nothing %s sent in %s: it did not happen",
		event:   "delay of what %s sends to the API server by %s (then delivered)",
	},
	faultPartition: {
		hold:    (*netfault.Proxy).Partition,
		mark:    "cut %s off the API server for %s",
		nothing: "the partition held nothing %s or the API server sent in %s: it did not happen",
		event:   "partition of %s from the API server for %s (then healed, connections open)",
	},
}

// holdRequests holds what the victim's proxy carries for DelayFor, as the
// delay or the partition fault does, and delivers it late. The fault is
// over once what the victim sent at its start arrived and was answered.
func (fs *faults) holdRequests(ctx context.Context, f *fleet, s *slot, kind faultKind) error {
	r := fs.r
	o, how := r.opts, heldFault[kind]
	if s.proxy == nil {
		return fmt.Errorf("%s of %s: it does not reach the API server through a proxy", kind, s.id)
	}
	held := s.proxy.Delayed()
	r.mark(how.mark, s.id, o.DelayFor)
	at := time.Now()
	how.hold(s.proxy, o.DelayFor)
	fs.noteHeld(kind, s.id, at)
	if err := sleep(ctx, o.DelayFor+o.RetryPeriod); err != nil {
		return err
	}
	if s.proxy.Delayed() == held {
		return fmt.Errorf(how.nothing, s.id, o.DelayFor)
	}
	r.handover(ctx, f, fmt.Sprintf(how.event, s.id, o.DelayFor), at)
	return nil
}

// podNetworkFaults is what the node's fault command (Options.NodeFaults)
// does to a replica pod's network for each network fault, and how the run
// names it: on and off, with the fault's command words.
var podNetworkFaults = map[faultKind]struct {
	command, on, off, event string
}{
	// Its veth down: nothing it sends or is sent reaches it, its
	// connections stay open, and what it sent meanwhile is retransmitted
	// late.
	faultPartition: {"veth", "down", "up", "partition of pod %s (its veth down for %s, then up)"},
	// What it sends to the API server dropped in its network namespace:
	// its requests arrive late, once TCP sends them again; what the server
	// sends still reaches it.
	faultDelay: {"hold", "on", "off", "delay of what pod %s sends to the API server (dropped for %s, then sent again by TCP)"},
}

// podNetworkFault applies a network fault to a replica pod for DelayFor,
// then ends it.
func (fs *faults) podNetworkFault(ctx context.Context, f *fleet, s *slot, kind faultKind) error {
	r := fs.r
	o, how := r.opts, podNetworkFaults[kind]
	var c *container
	if in := s.current(); in != nil {
		c, _ = in.proc.(*container)
	}
	if c == nil || o.NodeFaults == "" {
		return fmt.Errorf("%s of %s: no pod's container, or no --node-faults", kind, s.id)
	}
	r.mark("%s %s of %s for %s", how.command, how.on, s.id, o.DelayFor)
	at := time.Now()
	if err := nodeFault(ctx, o.NodeFaults, how.command, how.on, c.id); err != nil {
		return err
	}
	fs.noteHeld(kind, s.id, at)
	err := sleep(ctx, o.DelayFor)
	// Ended on every way out: a pod left cut off would fail the rest.
	r.mark("%s %s of %s", how.command, how.off, s.id)
	if uerr := nodeFault(context.WithoutCancel(ctx), o.NodeFaults, how.command, how.off, c.id); err == nil {
		err = uerr
	}
	if err != nil {
		return err
	}
	r.handover(ctx, f, fmt.Sprintf(how.event, s.id, o.DelayFor), at)
	return nil
}

// nodeFault runs the node's fault command (Options.NodeFaults).
func nodeFault(ctx context.Context, command string, args ...string) error {
	out, err := exec.CommandContext(ctx, command, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", command, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// restartNodeAPIServer has the node's fault command restart its
// kube-apiserver, and waits until it answers /readyz again.
func restartNodeAPIServer(ctx context.Context, command string, cfg *rest.Config) error {
	if err := nodeFault(ctx, command, "restart", "kube-apiserver"); err != nil {
		return err
	}
	if err := controlplane.WaitReady(ctx, cfg, 3*time.Minute); err != nil {
		return fmt.Errorf("restarting the API server: %w", err)
	}
	return nil
}

// apiServerRestart is one restart of the API server: when it began, when
// the server answered again and when the fleet settled after it. No Lease
// can be renewed or taken between At and Ready: the unowned check excuses
// what the outage explains. The relist check counts syncs from At until
// Counted, when the restarted server's own count of the syncs it completed
// was read (closeRestartWindow: before the next fault, or at the end of the
// run), or a chaos interval after Settled when none was read.
type apiServerRestart struct {
	At, Ready, Settled time.Time
	Counted            time.Time
	// Syncs is what the restarted server counted; CountErr why it could
	// not be read.
	Syncs    serverSyncs
	CountErr string
}

// noteRestart records an API server restart, for the relist evidence and
// the unowned check.
func (fs *faults) noteRestart(x apiServerRestart) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.restarts = append(fs.restarts, x)
}

// closeRestartWindow ends the relist window of the last API server
// restart, if still open: it reads the initial syncs the restarted server
// completed since it started, which are this window's (the server's
// counters start over with its process).
func (fs *faults) closeRestartWindow(ctx context.Context) {
	fs.mu.Lock()
	n := len(fs.restarts)
	open := n > 0 && fs.restarts[n-1].Counted.IsZero()
	fs.mu.Unlock()
	if !open {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	now := time.Now()
	syncs, err := fs.serverSyncs(ctx, now)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	x := &fs.restarts[n-1]
	x.Counted, x.Syncs = now, syncs
	switch {
	case err != nil:
		x.CountErr = err.Error()
	case syncs.Started.Before(x.At.Add(-time.Second)):
		x.CountErr = fmt.Sprintf("the API server read started at %s, before the restart at %s: its counts are not the restart's", syncs.Started.Format(time.StampMilli), x.At.Format(time.StampMilli))
	}
}

// relistResources are the resources whose initial syncs after an API
// server restart the relist check counts at the server: the ones the
// replicas cache cluster-wide, and the load tester does not.
var relistResources = []string{resourceBindings, resourceConfigMaps, "externaldomains"}

// serverSyncs is the API server's own count of the initial syncs it
// completed at cluster scope since its process started.
type serverSyncs struct {
	// Started is the process's start (process_start_time_seconds).
	Started time.Time
	// ByResource counts, per relistResources, LISTs answered 200 and
	// watch-lists that sent their initial-events-end bookmark
	// (apiserver_watch_list_duration_seconds observes a watch-list only
	// then): an attempt the server refused or ended before its initial
	// events is not one. Only cluster-scoped requests count: the
	// replicas' informers are cluster-wide, the load tester's are in its
	// own namespaces.
	ByResource map[string]float64
}

// serverSyncs reads the API server's counts at, through Prometheus, once
// it has scraped the server after at.
func (fs *faults) serverSyncs(ctx context.Context, at time.Time) (serverSyncs, error) {
	prom := fs.r.prom
	// Read at the API server's own first successful scrape after at: a
	// restarted server on a loaded machine may fail a few, and its series
	// are stale until one succeeds.
	readAt, err := prom.scrapedAfter(ctx, jobAPIServer, at)
	if err != nil {
		return serverSyncs{}, err
	}
	started, err := prom.scalar(ctx, fmt.Sprintf(`max(process_start_time_seconds{job=%q})`, jobAPIServer), readAt)
	if err != nil {
		return serverSyncs{}, fmt.Errorf("the API server's start: %w", err)
	}
	out := serverSyncs{Started: time.UnixMilli(int64(started * 1000)), ByResource: map[string]float64{}}
	res := strings.Join(relistResources, "|")
	q := fmt.Sprintf(`sum by (resource) (apiserver_request_total{job=%q,verb="LIST",scope="cluster",code="200",resource=~%q}) `+
		`+ on (resource) group_left sum by (resource) (apiserver_watch_list_duration_seconds_count{job=%q,scope="cluster",resource=~%q}) `+
		`or sum by (resource) (apiserver_watch_list_duration_seconds_count{job=%q,scope="cluster",resource=~%q}) `+
		`or sum by (resource) (apiserver_request_total{job=%q,verb="LIST",scope="cluster",code="200",resource=~%q})`,
		jobAPIServer, res, jobAPIServer, res, jobAPIServer, res, jobAPIServer, res)
	v, err := prom.vector(ctx, q, readAt)
	if err != nil {
		return serverSyncs{}, err
	}
	for _, s := range v {
		out.ByResource[string(s.Metric["resource"])] = float64(s.Value)
	}
	for _, res := range relistResources {
		out.ByResource[res] += 0 // a resource with neither is 0 syncs
	}
	return out, nil
}

// closeProxies closes the delay and partition faults' proxies.
func (fs *faults) closeProxies() {
	fs.mu.Lock()
	proxies := fs.proxies
	fs.proxies = nil
	fs.mu.Unlock()
	for _, p := range proxies {
		if err := p.Close(); err != nil {
			fs.r.log.Error(err, "Closing a proxy to the API server", "addr", p.Addr())
		}
	}
}
