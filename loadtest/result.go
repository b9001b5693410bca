package loadtest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kshard/kshard/internal/audit"
)

// Report is what a run measured and concluded. It is written as Markdown,
// and as JSON for tools (with every query as it was evaluated).
type Report struct {
	Scenario    string
	Description string
	Command     string
	Machine     Machine
	Started     time.Time
	Wall        time.Duration
	Settings    [][2]string
	// Source is the commit of the source tree the run measured.
	Source Source
	// Gated says the checks decide the exit code (chaos, rolling-restart);
	// elsewhere they are reported only.
	Gated  bool
	Passed bool
	// Error is why the run itself failed, if it did.
	Error  string `json:",omitempty"`
	Checks []Check
	// Writes is what the API server's audit log showed of the replicas'
	// writes, and Audit what the replicas' audit logs showed of their
	// reconciles, for a run with a sharded fleet.
	Writes *WriteEvidence `json:",omitempty"`
	Audit  *AuditSummary  `json:",omitempty"`
	Fleets []*FleetResult
	Events []EventResult
	// Capacity is each fleet's capacity, for the capacity scenario.
	Capacity []CapacityResult `json:",omitempty"`
	// Findings are scenario-specific observations (an outage's effect, the
	// HPA's decisions), one sentence each.
	Findings []string
	Notes    []string
	// guide is the link from the report to loadtest/README.md; "" for the
	// default report folder's.
	guide string
	// mu guards what the scenario's goroutines add while it runs.
	mu sync.Mutex
}

// addCheck records a scenario's own check.
func (rep *Report) addCheck(c Check) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.Checks = append(rep.Checks, c)
}

// addFinding records a scenario's observation.
func (rep *Report) addFinding(s string) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.Findings = append(rep.Findings, s)
}

// addEvent records an event the fleet settled after, or did not.
func (rep *Report) addEvent(ev EventResult) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.Events = append(rep.Events, ev)
}

// Machine is where the run ran: its numbers hold for this machine.
type Machine struct {
	CPUs          int
	CPUModel      string
	GoVersion     string
	OS            string
	KubeAPIServer string
	// ControlPlaneGOGC is the GOGC of the etcd and kube-apiserver the run
	// started; empty for a --kubeconfig cluster.
	ControlPlaneGOGC string `json:",omitempty"`
	// LoadMean and LoadMax are the 1-minute load average during the run
	// (sampled): how busy the machine was, with everything else on it; -1
	// without a sample (not Linux).
	LoadMean, LoadMax float64
	// Calibration is the API server's write ceiling measured before the
	// first fleet; nil when turned off (--calibrate-for 0).
	Calibration *Calibration `json:",omitempty"`
	// Pods says which StatefulSet's pods the replicas were
	// (Options.StatefulSet); empty when they were the load tester's
	// processes.
	Pods string `json:",omitempty"`
}

// Check is one invariant the run verified. A check passes on data only: one
// with nothing to decide on (no audit record, no object, no sample) fails
// with NoData set, as a check that saw nothing proves nothing. One about
// something the run did not have (no sharded fleet, no memory limit)
// passes with NotApplicable set. Detail says which, and why.
type Check struct {
	Name          string
	Passed        bool
	NoData        bool `json:",omitempty"`
	NotApplicable bool `json:",omitempty"`
	Detail        string
}

// noDataCheck is a check that had nothing to decide on: it fails.
func noDataCheck(name, why string) Check {
	return Check{Name: name, NoData: true, Detail: "no data: " + why}
}

// notApplicableCheck is a check about something the run did not have: it
// passes.
func notApplicableCheck(name, why string) Check {
	return Check{Name: name, Passed: true, NotApplicable: true, Detail: "not applicable: " + why}
}

// LatencySummary summarises latencies the load tester measured itself
// (durations); with Count 0 there is no data.
type LatencySummary struct {
	Count         int
	P50, P99, Max time.Duration
}

// FleetResult is what one fleet did: what it ran, its start and create
// storm as the load tester timed them, and its figures, each a query of
// queries/fleets.yaml against the run's Prometheus.
type FleetResult struct {
	Fleet string
	Mode  string
	Args  []string
	// Plain says the fleet ran cmd/plaincontroller (no kshard code), not
	// `kshard controller`: it has no audit log and no kshard_* metrics.
	Plain bool `json:",omitempty"`
	// Sharded says the fleet ran sharded: a ring of shard Leases and a
	// labeler.
	Sharded  bool
	Replicas int
	// Window is the measured phase.
	Window time.Duration
	// StartSettled is the fleet's start event's settle time: from its first
	// process until every replica was ready, every object reconciled by the
	// fleet (audit logs when sharded; the reconcile counters reaching the
	// object count with empty queues otherwise) and Ready at its latest
	// generation. StartError says why it did not settle; StartObjects is
	// the number of objects then.
	StartSettled time.Duration
	StartError   string `json:",omitempty"`
	StartObjects int
	// ShardTableDomains is the domains in the labeler's shard table when a
	// sharded fleet started: those whose objects the shard-label policy
	// labels at their CREATE. -1 for no table (a cold start: the labeler
	// labels every object of a new domain), and for fleets without a
	// labeler.
	ShardTableDomains int
	// Storm is the fleet's create storm: the objects created while it ran,
	// or the ones it found at its start.
	Storm CreateStorm
	// Split divides the end-to-end latency of the phase's spec updates at
	// the reconcile that made each Ready (from the audit log; sharded fleets
	// only, nil otherwise).
	Split *LatencySplit `json:",omitempty"`

	// Figures are the Fleets table's rows, and ReplicaFigures the
	// per-replica table's, each a PromQL query against the run's Prometheus
	// (queries/fleets.yaml).
	Figures        []Figure
	ReplicaFigures []ReplicaFigures
}

// fleetResult is a stopped fleet's result, before its figures are read.
func (rp reporter) fleetResult(f *fleet) *FleetResult {
	r := rp.r
	label := f.label()
	f.mu.Lock()
	defer f.mu.Unlock()
	args := f.mode.Args
	if !f.mode.Plain {
		args = append(slices.Clone(args), r.opts.ReplicaArgs...)
	}
	res := &FleetResult{Fleet: label, Mode: f.mode.Name, Args: args, Plain: f.mode.Plain, Replicas: slices.Max(append([]int{0}, f.sizes...)),
		Window: f.loadTo.Sub(f.loadFrom), Storm: f.storm,
		StartSettled: f.startEvent.Reconciled, StartError: f.startEvent.Error, StartObjects: f.startObjects, ShardTableDomains: -1}
	if res.Sharded = f.mode.Sharded(); res.Sharded {
		res.ShardTableDomains = f.tableDomains
	}
	return res
}

// newReport starts the run's report: what it is, where it runs, and its
// settings in words.
func (rp reporter) newReport(ctx context.Context) *Report {
	r := rp.r
	o := r.opts
	src, err := readSource(ctx)
	if err != nil {
		r.log.Error(err, "Reading the commit of the source tree; the report says commit: unknown")
	}
	rep := &Report{
		Source:      src,
		Scenario:    o.Scenario,
		Description: r.sc.Doc,
		Command:     o.Command,
		Started:     time.Now(),
		Gated:       r.sc.Gate,
		Machine: Machine{
			CPUs: runtime.NumCPU(), CPUModel: cpuModel(), GoVersion: runtime.Version(),
			OS: runtime.GOOS + "/" + runtime.GOARCH, KubeAPIServer: r.serverVersion,
			ControlPlaneGOGC: r.controlPlaneGOGC,
			Calibration:      r.calibration,
		},
	}
	if t := r.pods; t != nil {
		rep.Machine.Pods = fmt.Sprintf("the pods of StatefulSet %s/%s", t.namespace, t.name)
	}
	rep.Settings = rp.settings()
	return rep
}

// settings is the report's settings table, in order.
func (rp reporter) settings() [][2]string {
	r := rp.r
	o := r.opts
	var out [][2]string
	set := func(k, v string) { out = append(out, [2]string{k, v}) }
	set("objects", fmt.Sprintf("%d ConfigBindings over %d domains (%s), %d of %d keys each", o.Objects, o.Domains, skewText(o), o.KeysPerObject, o.KeysPerDomain))
	set("load", rp.loadSetting())
	rp.replicaSettings(set)
	set("API server write ceiling (calibration)", ceilingText(r.calibration))
	switch {
	case r.apiAuditLog == "":
		set("API server audit log", "none (a cluster of --kubeconfig without --apiserver-audit-log): the write check has no data")
	case r.opts.Kubeconfig == "":
		set("API server audit log", "written by the run's control plane under internal/audit's policy (writes to Leases, ConfigMaps, ConfigBindings, ExternalDomains, with the objects; blocking mode), read by the write check")
	default:
		set("API server audit log", r.apiAuditLog+", read by the write check")
	}
	set("leases", fmt.Sprintf("duration %s, renew deadline %s, retry period %s; %d shards", o.LeaseDuration, o.RenewDeadline, o.RetryPeriod, o.Shards))
	if o.OutageFor > 0 {
		set("outage", fmt.Sprintf("config center %s from %s into the measured phase, for %s", r.center.outage(), o.OutageAfter, o.OutageFor))
	}
	if r.sc.Faults {
		var rotation []string
		for _, k := range r.faults.rotation {
			rotation = append(rotation, rp.faultText(k))
		}
		set("chaos", fmt.Sprintf("a fault on a random replica every %s (from the settle after the last one), in rotation: %s", o.ChaosInterval, strings.Join(rotation, ", ")))
	}
	if m, _ := o.replicaMillicores(); m > 0 {
		set("replica CPU", fmt.Sprintf("%s per replica process: a cgroup of its own (cgroup v1 CFS), quota %s per %s period, entered before the replica binary runs", o.ReplicaCPU, time.Duration(m)*cpuQuotaPeriod/1000, cpuQuotaPeriod))
	}
	if r.pods != nil {
		set("memory limit", o.MemoryLimit+" per replica, the container's limit")
	} else {
		set("memory limit", memorySetting(o))
	}
	return out
}

// loadSetting says what load the run put on the replicas.
func (rp reporter) loadSetting() string {
	r := rp.r
	o := r.opts
	switch {
	case r.sc.name == "capacity":
		return fmt.Sprintf("creates at %g/s; spec updates to random objects in windows of %s, the first fleet's first at %g/s (--update-rate × objects), a later fleet's first at %.1f × its replicas × the first fleet's capacity per replica", o.CreateRate, o.Duration, o.UpdateRate*float64(o.Objects), capacityStartShare)
	case r.sc.NoLoad:
		return fmt.Sprintf("creates at %g/s; no continuous updates: the scenario's storms are the load", o.CreateRate)
	}
	return fmt.Sprintf("creates at %g/s; spec updates at %g per object per second (%g/s in all) for %s per measured phase", o.CreateRate, o.UpdateRate, float64(o.Objects)*o.UpdateRate, o.Duration)
}

// replicaSettings say what the replicas and the config center were: a
// StatefulSet's pods and the cluster's config center, or the load
// tester's processes with its identity for each.
func (rp reporter) replicaSettings(set func(k, v string)) {
	r := rp.r
	o := r.opts
	if t := r.pods; t != nil {
		set("replicas", fmt.Sprintf("%d pods of StatefulSet %s/%s (image %s, ring %s), scaled and deleted through the API server; "+
			"audit records from the container logs, metrics over HTTPS with the load tester's ServiceAccount token", o.Replicas, t.namespace, t.name, t.image, t.ring))
		set("config center", r.center.String())
		return
	}
	set("replicas", fmt.Sprintf("%d (scenario-specific fleets below)", o.Replicas))
	if fe := r.fencing; fe != nil {
		policy := "deploy/base's " + audit.FencingPolicy + " admission policy, which refuses a shard write by a pod not holding the shard's Lease"
		if !fe.enforced {
			policy = "the " + audit.FencingPolicy + " admission policy NOT bound (--no-fencing): the API server refuses no late write"
		}
		set("replica identity", "sharded replicas: a token of deploy/base's ServiceAccount bound to a Pod object of the replica's name (created, never run), deploy/base's RBAC, "+
			policy+"; sharding off and the plain controller: the load tester's admin credentials")
	}
	set("config center", r.center.String())
}

// faultText says what a fault of the kind does, on pods or on the load
// tester's processes.
func (rp reporter) faultText(k faultKind) string {
	r := rp.r
	o := r.opts
	if r.pods != nil {
		return map[faultKind]string{
			faultForceDelete:      "forced pod deletion (grace 0, as kubectl delete pod --grace-period=0 --force: the kubelet still sends SIGTERM with 2 s to go; the StatefulSet recreates the pod at once)",
			faultDelete:           "pod deletion with its grace period (the StatefulSet recreates the pod at once)",
			faultDelay:            fmt.Sprintf("delay (what the pod sends to the API server dropped for %s in its network namespace, then sent again by TCP: %s)", o.DelayFor, o.NodeFaults),
			faultPartition:        fmt.Sprintf("partition (the pod's veth down for %s, then up: %s)", o.DelayFor, o.NodeFaults),
			faultAPIServerRestart: fmt.Sprintf("API server restart (SIGTERM, then the same command line: %s)", o.NodeFaults),
		}[k]
	}
	return map[faultKind]string{
		faultKill:             fmt.Sprintf("kill (SIGKILL, restarted after %s)", o.RestartDelay),
		faultPause:            fmt.Sprintf("pause (SIGSTOP for %s, then SIGCONT)", o.PauseFor),
		faultClock:            fmt.Sprintf("clock offset (SIGTERM, restarted with --lease-clock-offset %s, then %s, in turn, kept until another fault restarts it)", signed(o.ClockOffset), signed(-o.ClockOffset)),
		faultDelay:            fmt.Sprintf("delay (what it sends to the API server held for %s by a proxy on its connection, then delivered)", o.DelayFor),
		faultPartition:        fmt.Sprintf("partition (both ways of its connection to the API server held for %s by the proxy, then delivered)", o.DelayFor),
		faultAPIServerRestart: "API server restart (SIGTERM, then the same command line, port and certificates)",
	}[k]
}

// memorySetting says what --memory-limit the replicas got.
func memorySetting(o Options) string {
	if b, _ := o.memoryLimitBytes(); b <= 0 {
		return "none (--memory-limit 0)"
	}
	limit := fmt.Sprintf("%s per kshard replica (--memory-limit: Go soft limit 90 %%, external cache a quarter)", o.MemoryLimit)
	if o.MemoryLimit == DefaultMemoryLimit {
		limit += ", deploy/base's"
	}
	return limit
}

func skewText(o Options) string {
	if o.Skew == SkewZipf {
		return fmt.Sprintf("Zipf, s=%g", o.ZipfS)
	}
	return "uniform"
}

// cpuModel reads the CPU model on Linux; elsewhere it is unknown.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// finish runs the checks every scenario reports, after the last fleet
// stopped.
func (rp reporter) finish(ctx context.Context, runErr error) {
	r := rp.r
	rep := r.report
	rep.Wall = time.Since(rep.Started)
	rep.Machine.LoadMean, rep.Machine.LoadMax = -1, -1
	run := fmt.Sprintf("[%dms]", max(time.Since(r.begin).Milliseconds(), 1))
	if v, err := r.prom.scalar(ctx, "avg_over_time(loadtest_machine_load1"+run+")", time.Now()); err == nil {
		rep.Machine.LoadMean = v
	}
	if v, err := r.prom.scalar(ctx, "max_over_time(loadtest_machine_load1"+run+")", time.Now()); err == nil {
		rep.Machine.LoadMax = v
	}
	sharded := false
	for _, f := range r.fleets.list() {
		if f.result != nil {
			rep.Fleets = append(rep.Fleets, f.result)
		}
		sharded = sharded || f.mode.Sharded()
	}
	rp.measureEvents(ctx)
	for _, conclude := range r.concluders {
		conclude(ctx)
	}

	// 1. Writes outside a tenure, from the API server's audit log; 2.
	// overlapping reconciles, from every replica process's audit log.
	rp.auditChecks(sharded)
	// 3. Every object's latest generation Ready after the final settle.
	rep.Checks = append(rep.Checks, readyCheck(r.tracker.notReady()))
	// 4. No shard unowned beyond lease duration + retry period.
	bound := r.opts.LeaseDuration + r.opts.RetryPeriod
	if !sharded {
		rep.Checks = append(rep.Checks, notApplicableCheck("no shard unowned beyond "+bound.String(), "no sharded fleet"))
	} else {
		_, outages := r.faults.record()
		rep.Checks = append(rep.Checks, unownedCheck(r.ring.unownedIntervals(), r.ring.guardedTicks(), bound, r.begin, outages))
	}
	// 5. Every event settled.
	rep.Checks = append(rep.Checks, eventsCheck(rep.Events, r.opts.SettleTimeout))
	// 6. No replica's resident memory beyond its memory limit; on pods, no
	// container restarted or OOM-killed.
	var restarts *containerRestarts
	if r.pods != nil {
		n, rs := r.pods.restarts(r.begin)
		restarts = &containerRestarts{pods: n, restarts: rs}
	}
	limit, _ := r.opts.memoryLimitBytes()
	rep.Checks = append(rep.Checks, memoryCheck(rep.Fleets, float64(limit), restarts))

	rep.Passed = runErr == nil
	for _, c := range rep.Checks {
		rep.Passed = rep.Passed && c.Passed
	}
	if runErr != nil {
		rep.Error = runErr.Error()
	}
	rp.addNotes(ctx)
	sort.SliceStable(rep.Events, func(i, j int) bool { return rep.Events[i].At < rep.Events[j].At })
}

// auditChecks add the checks from the audit logs: no write outside its
// writer's tenure (the API server's), no overlapping reconciles (every
// replica process's). A plain fleet has no audit log, so its reconciles
// are not checked; one active replica holds no shard Lease, so its writes
// are not.
func (rp reporter) auditChecks(sharded bool) {
	r := rp.r
	rep := r.report
	var files []auditFile
	var plain, single []string
	pauses := map[string][]window{}
	for _, f := range r.fleets.list() {
		files = append(files, f.auditFiles()...)
		switch {
		case f.mode.Plain:
			plain = append(plain, f.label())
		case !f.mode.Sharded():
			single = append(single, f.label())
		}
		for id, ws := range f.pauseWindows() {
			pauses[id] = append(pauses[id], ws...)
		}
	}
	notAudited, notChecked := "", ""
	if len(plain) > 0 {
		notAudited = fmt.Sprintf("; not checked for %s: no kshard code, no audit log (one active replica)", strings.Join(plain, ", "))
	}
	if unsharded := append(single, plain...); len(unsharded) > 0 {
		notChecked = fmt.Sprintf("; not checked for %s: one active replica, no shard Lease", strings.Join(unsharded, ", "))
	}
	if !sharded {
		na := "no sharded fleet (one active replica)"
		rep.Checks = append(rep.Checks, notApplicableCheck(checkWrites, na+notChecked), notApplicableCheck(checkReconciles, na+notAudited))
		return
	}
	rep.Writes = writeEvidence(rp.evidence())
	rep.Checks = append(rep.Checks, rep.Writes.check(notChecked))
	if c, ok := rep.Writes.relistCheck(); ok {
		rep.Checks = append(rep.Checks, c)
	}
	for _, d := range rep.Writes.Delays {
		rep.Findings = append(rep.Findings, d.String())
	}
	data, err := readAudit(files, time.Now())
	if err != nil {
		rep.Checks = append(rep.Checks, noDataCheck(checkReconciles, err.Error()+notAudited))
		return
	}
	rep.Audit = auditSummary(data, len(files), audit.Overlaps(data.ByObject), pauses, r.opts.RetryPeriod)
	for _, f := range r.fleets.list() {
		if f.result != nil && f.mode.Sharded() && !f.loadFrom.IsZero() {
			f.result.Split = splitLatencies(r.tracker.samplesBetween(f.loadFrom, f.loadTo, writeUpdate), data.ByObject)
		}
	}
	rep.Checks = append(rep.Checks, rep.Audit.reconcileCheck(notAudited))
}

// addNotes notes what makes some of the report's figures partial: the
// load tester's own failed writes, an API server restart during a fleet.
func (rp reporter) addNotes(ctx context.Context) {
	r := rp.r
	rep := r.report
	st := &r.gen.stats
	if e := st.errors.Load(); e > 0 {
		last, _ := st.lastErr.Load().(string)
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d of the load tester's writes failed (not retried, not counted as latency); the last: %s", e, last))
	}
	for _, f := range r.fleets.list() {
		q := fmt.Sprintf(`changes(process_start_time_seconds{job=%q}[%dms])`, jobAPIServer, max(f.stopped.Sub(f.started).Milliseconds(), 1))
		if n, err := r.prom.scalar(ctx, q, f.stopped); err == nil && n > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("The API server restarted while %s ran: its counters started over, so the fleet's counts of what it served over spans across the restart count only what it served after it.", f.label()))
		}
	}
}

// readyCheck passes when every object tracked is Ready at its latest
// generation (n of total are not; ex are examples); without objects it has
// no data.
func readyCheck(n, total int, ex []string) Check {
	const name = "every latest generation became Ready"
	if total == 0 {
		return noDataCheck(name, "the run tracked no object")
	}
	c := Check{Name: name, Passed: n == 0, Detail: fmt.Sprintf("%d of %d objects Ready at their latest generation", total-n, total)}
	if n > 0 {
		c.Detail += "; e.g. " + strings.Join(ex, "; ")
	}
	return c
}

// unownedCheck passes when no unowned interval of a shard (iv, longest
// first) lasted beyond bound. ticks counts the ring watch's checks of
// ownership while a sharded fleet ran: without any, "no interval" would
// say nothing, so the check has no data. While the API server is away
// (outages) no Lease can be renewed or taken: an interval that overlaps an
// outage is excused when it ended within bound after the server answered
// again.
func unownedCheck(iv []unownedInterval, ticks int, bound time.Duration, begin time.Time, outages []apiServerRestart) Check {
	name := fmt.Sprintf("no shard unowned beyond lease duration + retry period (%s)", bound)
	switch {
	case ticks == 0:
		return noDataCheck(name, "the ring watch never checked the shards' ownership while a sharded fleet ran")
	case len(iv) == 0:
		return Check{Name: name, Passed: true, Detail: fmt.Sprintf("no shard was ever without a running holder while the fleets ran (%d checks of every shard)", ticks)}
	}
	longest := iv[0]
	over, excused := 0, 0
	for _, x := range iv {
		if x.To.Sub(x.From) <= bound {
			continue
		}
		outage := false
		for _, o := range outages {
			if x.From.Before(o.Ready) && !x.To.After(o.At) {
				continue
			}
			if x.From.Before(o.Ready) && !x.To.After(o.Ready.Add(bound)) {
				outage = true
			}
		}
		if outage {
			excused++
		} else {
			over++
		}
	}
	c := Check{Name: name, Passed: over == 0, Detail: fmt.Sprintf("%d unowned intervals; the longest: shard %d for %s (from %s into the run)",
		len(iv), longest.Shard, round(longest.To.Sub(longest.From)), round(longest.From.Sub(begin)))}
	if over > 0 {
		c.Detail += fmt.Sprintf("; %d beyond the bound", over)
	}
	if excused > 0 {
		c.Detail += fmt.Sprintf("; %d longer across an API server restart, each held again within the bound after the server answered again (not a failure: no Lease can be renewed or taken while it is away)", excused)
	}
	return c
}

// eventsCheck passes when every event settled within the settle timeout.
// Every fleet's start is an event, so a run without events has no data.
func eventsCheck(events []EventResult, timeout time.Duration) Check {
	name := "every event settled within " + timeout.String()
	if len(events) == 0 {
		return noDataCheck(name, "no event was recorded, not even a fleet's start")
	}
	var unsettled []string
	for _, ev := range events {
		if ev.Error != "" {
			unsettled = append(unsettled, ev.Name+": "+ev.Error)
		}
	}
	return Check{Name: name, Passed: len(unsettled) == 0, Detail: fmt.Sprintf("%d events", len(events)) + strings.Join(append([]string{""}, unsettled...), "; ")}
}

// containerRestarts is what the pod watch saw of the replicas' containers
// on a StatefulSet's pods: how many pods, and which of their containers
// restarted or were OOM-killed during the run.
type containerRestarts struct {
	pods     int
	restarts []podRestart
}

// colRSSPeak is the per-replica table's column the memory check reads
// (queries/fleets.yaml).
const colRSSPeak = "RSS peak"

// rssPeak is the replica of the fleet with the largest peak resident
// memory, and that peak; false when no replica has the figure.
func (f *FleetResult) rssPeak() (replica string, bytes float64, ok bool) {
	for _, r := range f.ReplicaFigures {
		for _, x := range r.Figures {
			if x.Name == colRSSPeak && x.NoData == "" && (!ok || x.Value > bytes) {
				replica, bytes, ok = r.Replica, x.Value, true
			}
		}
	}
	return replica, bytes, ok
}

// memoryCheck passes when no replica's peak resident memory reached the
// memory limit it ran with (limit, 0 for none; a plain fleet has none): in a container with that limit (deploy/base's),
// the kernel would have killed it. A fleet with a limit but no resident
// memory measured has no data, which fails it. On pods (pods not nil) the
// kernel's kill is seen as it happens: a container that restarted or was
// OOM-killed fails it too, named, since between two scrapes a peak can
// pass unseen and the restarted process reports only its own memory.
func memoryCheck(fleets []*FleetResult, limit float64, pods *containerRestarts) Check {
	name := "peak resident memory below the memory limit"
	if pods != nil {
		name += ", no replica container restarted or OOM-killed"
	}
	var worst *FleetResult
	var worstReplica string
	var worstRSS float64
	var unmeasured []string
	passed := true
	for _, f := range fleets {
		if limit <= 0 || f.Plain {
			continue
		}
		replica, rss, ok := f.rssPeak()
		if !ok {
			unmeasured = append(unmeasured, f.Fleet)
			continue
		}
		if worst == nil || rss > worstRSS {
			worst, worstReplica, worstRSS = f, replica, rss
		}
		passed = passed && rss < limit
	}
	noLimit := "no replica ran with a memory limit (--memory-limit 0, or the plain controller, which has none)"
	var c Check
	switch {
	case len(unmeasured) > 0:
		c = noDataCheck(name, "no resident memory measured of "+strings.Join(unmeasured, ", "))
	case worst == nil && pods == nil:
		return notApplicableCheck(name, noLimit)
	case worst == nil:
		c = Check{Name: name, Passed: true, Detail: noLimit}
	default:
		c = Check{Name: name, Passed: passed}
	}
	var parts []string
	if c.Detail != "" {
		parts = append(parts, c.Detail)
	}
	if worst != nil {
		parts = append(parts, fmt.Sprintf("largest: %s of %s, %s (%.2f) of its %s limit (%s of the per-replica table)", worstReplica, worst.Fleet, formatBytes(worstRSS),
			worstRSS/limit, formatBytes(limit), colRSSPeak))
	}
	switch {
	case pods == nil:
	case len(pods.restarts) > 0:
		c.Passed = false
		var rs []string
		for _, r := range pods.restarts {
			rs = append(rs, r.String())
		}
		parts = append(parts, "RESTARTED: "+strings.Join(rs, "; "))
	case pods.pods == 0:
		c.Passed, c.NoData = false, true
		parts = append(parts, "no data: the pod watch saw no replica pod, so no restart or OOM kill was checked")
	default:
		parts = append(parts, fmt.Sprintf("no container of the %d replica pods seen restarted or was OOM-killed", pods.pods))
	}
	c.Detail = strings.Join(parts, "; ")
	return c
}
