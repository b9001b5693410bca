package loadtest

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

func TestFaultRotation(t *testing.T) {
	p := faultPlan{rotation: faultRotation, offset: 30 * time.Second}
	var got []fault
	for range 9 {
		got = append(got, p.next())
	}
	want := []fault{
		{kind: faultKill}, {kind: faultPause}, {kind: faultClock, offset: 30 * time.Second}, {kind: faultDelay}, {kind: faultPartition}, {kind: faultAPIServerRestart},
		{kind: faultKill}, {kind: faultPause}, {kind: faultClock, offset: -30 * time.Second},
	}
	if !slices.Equal(got, want) {
		t.Errorf("faults %v, want %v", got, want)
	}
	o := Options{RestartDelay: 5 * time.Second, PauseFor: 25 * time.Second, DelayFor: 26 * time.Second}
	for _, tc := range []struct {
		f    fault
		want time.Duration
	}{{want[0], 5 * time.Second}, {want[1], 25 * time.Second}, {want[2], 0}, {want[3], 26 * time.Second}, {want[4], 26 * time.Second}, {want[5], 0}} {
		if got := tc.f.lasts(o); got != tc.want {
			t.Errorf("%s lasts %s, want %s", tc.f.kind, got, tc.want)
		}
	}
	done := []injected{{fault: want[0], replica: "kshard-1", at: time.Minute}, {fault: want[8], replica: "kshard-0", at: 2 * time.Minute}, {fault: want[5], replica: "kshard-2", at: 3 * time.Minute}}
	if got, want := faultsFinding(faultRotation, done), "faults injected: 1 kill, 0 pause, 1 clock offset, 0 delay, 0 partition, 1 API server restart (kill of kshard-1 at 1m0s; clock offset -30s on kshard-0 at 2m0s; API server restart at 3m0s)"; got != want {
		t.Errorf("finding %q\nwant      %q", got, want)
	}
}

// TestFaultKinds: --faults chooses the rotation among the target's kinds,
// and refuses a kind the target cannot have.
func TestFaultKinds(t *testing.T) {
	if got, err := parseFaults("delay, kill", false, false); err != nil || !slices.Equal(got, []faultKind{faultDelay, faultKill}) {
		t.Errorf("delay, kill: %v (%v)", got, err)
	}
	if got, err := parseFaults("", true, false); err != nil || !slices.Equal(got, podFaultRotation) {
		t.Errorf("pods' default: %v (%v)", got, err)
	}
	if got, err := parseFaults("", true, true); err != nil || !slices.Equal(got, nodeFaultRotation) {
		t.Errorf("pods' default with node faults: %v (%v)", got, err)
	}
	for _, tc := range []struct {
		s          string
		pods, node bool
	}{{"delay", true, false}, {"partition", true, false}, {"apiserver-restart", true, false}, {"force-delete", false, false}, {"nap", false, false}} {
		if _, err := parseFaults(tc.s, tc.pods, tc.node); err == nil {
			t.Errorf("%q (pods %v, node faults %v) accepted", tc.s, tc.pods, tc.node)
		}
	}
}

func TestFaultOptions(t *testing.T) {
	o := Options{Scenario: "chaos", Out: t.TempDir()}
	if err := o.setDefaults(scenarios["chaos"]); err != nil {
		t.Fatal(err)
	}
	// The pause outlasts the Lease (15s) by two renewal periods and fits the
	// 30s interval.
	if o.PauseFor != 25*time.Second || o.ClockOffset != 30*time.Second || o.MemoryLimit != "512Mi" || o.Duration != 12*time.Minute {
		t.Errorf("chaos defaults: pause %s, clock offset %s, memory limit %s, duration %s", o.PauseFor, o.ClockOffset, o.MemoryLimit, o.Duration)
	}
	if b, err := o.memoryLimitBytes(); err != nil || b != 512<<20 {
		t.Errorf("memory limit %d bytes (%v)", b, err)
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{PauseFor: 15 * time.Second}, "must outlast the lease duration"},
		{Options{PauseFor: 30 * time.Second}, "fit the chaos interval"},
		{Options{ClockOffset: 10 * time.Second}, "clock offset 10s must exceed the lease duration"},
		{Options{MemoryLimit: "lots"}, `memory limit "lots"`},
		{Options{MemoryLimit: "-1Mi"}, `memory limit "-1Mi"`},
	} {
		o := tc.o
		o.Scenario, o.Out = "chaos", t.TempDir()
		err := o.setDefaults(scenarios["chaos"])
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one saying %q", tc.o, err, tc.want)
		}
	}
	// Only a scenario with faults checks them: a long lease elsewhere makes
	// a default pause that would not fit the chaos interval, harmlessly.
	o = Options{Scenario: "basic", LeaseDuration: 30 * time.Second, RenewDeadline: 20 * time.Second, Out: t.TempDir()}
	if err := o.setDefaults(scenarios["basic"]); err != nil {
		t.Errorf("basic with a 30s lease: %v", err)
	}
	// "0" passes no memory limit.
	o = Options{Scenario: "basic", MemoryLimit: "0", Out: t.TempDir()}
	if err := o.setDefaults(scenarios["basic"]); err != nil {
		t.Fatal(err)
	}
	if b, err := o.memoryLimitBytes(); err != nil || b != 0 {
		t.Errorf("memory limit 0: %d bytes (%v)", b, err)
	}
}

// TestReplicaArgsFaultsAndLimit: kshard gets the memory limit and a clock
// offset (negative too, as one argument); the plain controller, which has
// no such flags, never does.
func TestReplicaArgsFaultsAndLimit(t *testing.T) {
	c := testReplicaConfig()
	c.memoryLimit, c.clockOffset = "512Mi", -30*time.Second
	args := replicaArgs(ModeSharded, c)
	if i := slices.Index(args, "--memory-limit"); i < 0 || args[i+1] != "512Mi" {
		t.Errorf("no --memory-limit 512Mi in %v", args)
	}
	if !slices.Contains(args, "--lease-clock-offset=-30s") {
		t.Errorf("no --lease-clock-offset=-30s in %v", args)
	}
	c.audit = ""
	plain := flagNames(replicaArgs(ModePlain, c))
	if slices.Contains(plain, "memory-limit") || slices.Contains(plain, "lease-clock-offset") {
		t.Errorf("the plain controller got kshard-only flags: %v", plain)
	}
	c = testReplicaConfig()
	if names := flagNames(replicaArgs(ModeSharded, c)); slices.Contains(names, "memory-limit") || slices.Contains(names, "lease-clock-offset") {
		t.Errorf("flags without a limit or an offset: %v", names)
	}
}

// fakeProcess is a replica process that runs until done is closed.
type fakeProcess struct {
	started time.Time
	done    chan struct{}
}

func (p *fakeProcess) Started() time.Time { return p.started }

func (p *fakeProcess) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *fakeProcess) Wait() (time.Time, error) { <-p.done; return time.Time{}, nil }

func (p *fakeProcess) PeakRSS() (float64, bool) { return 0, false }

// testProcess is a replica process that runs (or ended), for the ring
// watch.
func testProcess(started time.Time, offset time.Duration, running bool) *instance {
	p := &fakeProcess{started: started, done: make(chan struct{})}
	if !running {
		close(p.done)
	}
	return &instance{proc: p, clockOffset: offset}
}

func shardLeaseObject(shard int32, holder string, acquire, renew time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: lease.ShardName(Ring, shard),
			Labels: map[string]string{sharding.LabelRing: Ring, sharding.LabelLeaseKind: lease.KindShard}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holder),
			LeaseDurationSeconds: ptr.To(int32(15)),
			AcquireTime:          &metav1.MicroTime{Time: acquire},
			RenewTime:            &metav1.MicroTime{Time: renew},
		},
	}
}

// TestRingWatchClockOffset: the times a replica with a clock offset writes
// into Leases are read on the machine's clock, and a Lease is held only by
// the process behind its holder identity, not by a later process of the
// same replica.
func TestRingWatchClockOffset(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ahead := testProcess(t0, 30*time.Second, true)   // kshard-0's first process
	behind := testProcess(t0, -30*time.Second, true) // kshard-1's
	procs := map[string][]*instance{"kshard-0": {ahead}, "kshard-1": {behind}}
	w := newRingState(Ring, sharding.DefaultShards, func(replica string, at time.Time) *instance {
		var newest *instance
		for _, in := range procs[replica] {
			if !in.proc.Started().After(at) {
				newest = in
			}
		}
		return newest
	})
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }

	// kshard-0 acquires shard 0 at 10s, writing 40s; kshard-1 shard 1 at
	// 10s, writing -20s.
	w.record(shardLeaseObject(0, "kshard-0_a", sec(40), sec(40)), false, sec(10))
	w.record(shardLeaseObject(1, "kshard-1_b", sec(-20), sec(-20)), false, sec(10))
	if l := w.shards[0]; !l.acquire.Equal(sec(10)) || !l.renew.Equal(sec(10)) {
		t.Errorf("shard 0: acquired %s, renewed %s; want both at 10s", l.acquire, l.renew)
	}
	// Both held until 10s + 15s, whatever their clocks said.
	for _, now := range []time.Time{sec(11), sec(24)} {
		if h := w.holdersNow(now); h[0] != "kshard-0" || h[1] != "kshard-1" {
			t.Errorf("at %s: holders %v", now.Sub(t0), h)
		}
	}
	if h := w.holdersNow(sec(26)); len(h) != 0 {
		t.Errorf("at 26s, unrenewed: holders %v, want none", h)
	}

	// kshard-1 releases shard 1 at 30s (writing 0s); kshard-0 takes it at
	// 31s (writing 61s).
	w.record(shardLeaseObject(1, "", sec(0), sec(0)), false, sec(30))
	w.record(shardLeaseObject(1, "kshard-0_a", sec(61), sec(61)), false, sec(31))
	if l := w.shards[1]; l.holder != "kshard-0" || !l.acquire.Equal(sec(31)) {
		t.Errorf("shard 1: held by %q from %s, want kshard-0 from 31s", l.holder, l.acquire.Sub(t0))
	}

	// kshard-0 restarts at 40s with no offset. Its old identity's Lease,
	// seen again (a renewal observed late), is not held by the new process.
	close(ahead.proc.(*fakeProcess).done)
	restarted := testProcess(sec(40), 0, true)
	procs["kshard-0"] = append(procs["kshard-0"], restarted)
	w.record(shardLeaseObject(0, "kshard-0_a", sec(70), sec(70)), false, sec(41))
	if h := w.holdersNow(sec(42)); h[0] != "" {
		t.Errorf("shard 0 held by %q after its holder's process ended", h[0])
	}
	w.record(shardLeaseObject(0, "kshard-0_c", sec(45), sec(45)), false, sec(45))
	if h := w.holdersNow(sec(46)); h[0] != "kshard-0" {
		t.Errorf("shard 0 held by %q, want the restarted kshard-0", h[0])
	}
	if w.writers["kshard-0_c"] != restarted || w.writers["kshard-0_a"] != ahead {
		t.Error("holder identities mapped to the wrong processes")
	}
}

// TestRingPoll: the poll takes in what the API server holds past a lagging
// watch, but never a version older than one the watch delivered.
func TestRingPoll(t *testing.T) {
	now := time.Now()
	proc := testProcess(now.Add(-time.Minute), 0, true)
	w := newRingState(Ring, sharding.DefaultShards, func(string, time.Time) *instance { return proc })
	lease := func(rv, holder string) *coordinationv1.Lease {
		l := shardLeaseObject(0, holder, now, now)
		l.ResourceVersion = rv
		return l
	}
	w.observe(lease("10", "kshard-0_a"), false)
	var mu sync.Mutex
	answer, calls := lease("7", ""), 0 // a release the watch has already passed
	w.list = func(context.Context) ([]coordinationv1.Lease, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return []coordinationv1.Lease{*answer}, nil
	}
	holder := func() string {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.owner(0, time.Now())
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), ringPoll, time.Minute, true, func(context.Context) (bool, error) {
			return cond(), nil
		}); err != nil {
			t.Fatalf("%s: holder %q", what, holder())
		}
	}
	stop := w.poll(t.Context())
	defer stop()
	until("three polls", func() bool { mu.Lock(); defer mu.Unlock(); return calls > 3 })
	if h := holder(); h != "kshard-0" {
		t.Fatalf("after polls of an older version: holder %q, want kshard-0", h)
	}
	mu.Lock()
	answer = lease("12", "kshard-1_b")
	mu.Unlock()
	until("the poll never took in the newer version", func() bool { return holder() == "kshard-1" })
}

func TestAcrossPause(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	iv := func(replica string, from, to int) audit.Interval {
		return audit.Interval{Replica: replica, Start: sec(from), End: sec(to)}
	}
	pauses := map[string][]window{"a": {{sec(10), sec(35)}}, "c": {{From: sec(10)}}}
	grace := 5 * time.Second
	for _, tc := range []struct {
		name string
		a, b audit.Interval
		want bool
	}{
		{"a's reconcile spans its pause and b's", iv("a", 9, 36), iv("b", 27, 28), true},
		{"either order", iv("b", 27, 28), iv("a", 9, 36), true},
		{"a began right after it was let go on, before fencing", iv("a", 36, 37), iv("b", 30, 40), true},
		{"a began after the grace", iv("a", 41, 42), iv("b", 30, 45), false},
		{"b began before the pause: side by side without one", iv("a", 9, 36), iv("b", 8, 12), false},
		{"no pause of either", iv("b", 0, 5), iv("d", 1, 2), false},
		{"still paused at the end of the run", iv("c", 9, 60), iv("b", 30, 31), true},
	} {
		if got := acrossPause(audit.Overlap{Object: "ns/x", A: tc.a, B: tc.b}, pauses, grace); got != tc.want {
			t.Errorf("%s: across a pause = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAuditReconcileCheck: the reconciles are read from the audit logs, and
// the overlaps a pause explains are reported without failing.
func TestAuditReconcileCheck(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := filepath.Join(dir, "a.0")
	writeAudit(t, p, false, rec("a", "start", "x", t0), rec("a", "end", "x", t0.Add(3*time.Second)))
	d, err := readAudit([]auditFile{{Path: p, Replica: "a"}}, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if d.Records != 2 || len(d.ByObject["ns/x"]) != 1 {
		t.Fatalf("%d records, reconciles %v", d.Records, d.ByObject)
	}

	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	pauses := map[string][]window{"a": {{sec(10), sec(35)}}}
	overlaps := []audit.Overlap{
		{Object: "ns/x", A: audit.Interval{Replica: "a", Start: sec(9), End: sec(36)}, B: audit.Interval{Replica: "b", Start: sec(27), End: sec(28)}},
		{Object: "ns/y", A: audit.Interval{Replica: "b", Start: sec(50), End: sec(52)}, B: audit.Interval{Replica: "c", Start: sec(51), End: sec(53)}},
	}
	a := auditSummary(d, 1, overlaps, pauses, 5*time.Second)
	if a.ReconcileOverlaps != 1 || a.OverlapsAcrossPause != 1 {
		t.Errorf("summary %+v", a)
	}
	if c := a.reconcileCheck(""); c.Passed || !strings.Contains(c.Detail, "1 across a pause") || !strings.Contains(c.Detail, "OVERLAP ns/y") {
		t.Errorf("reconcile check %+v: want it failed by ns/y only", c)
	}
}

func TestMemoryCheck(t *testing.T) {
	rss := func(replica string, v float64) []ReplicaFigures {
		return []ReplicaFigures{{Replica: replica, Figures: []Figure{{Name: colRSSPeak, Unit: "bytes", Value: v}}}}
	}
	fleets := []*FleetResult{
		{Fleet: "sharded ×1", ReplicaFigures: rss("kshard-0", 300<<20)},
		{Fleet: "plain controller-runtime ×1", Plain: true, ReplicaFigures: rss("plain-0", 900<<20)},
	}
	c := memoryCheck(fleets, 512<<20, nil)
	if !c.Passed || !strings.HasPrefix(c.Detail, "largest: kshard-0 of sharded ×1, 300.0 MiB (0.59) of its 512.0 MiB limit") {
		t.Errorf("memory check %+v", c)
	}
	fleets[0].ReplicaFigures = rss("kshard-0", 512<<20)
	if c := memoryCheck(fleets, 512<<20, nil); c.Passed {
		t.Errorf("at the limit: %+v, want a failure", c)
	}
	if c := memoryCheck(fleets, 0, nil); !c.Passed || !strings.HasPrefix(c.Detail, "not applicable") {
		t.Errorf("no limit: %+v", c)
	}
	// A fleet whose replicas' RSS no query found has no data: a failure.
	fleets[0].ReplicaFigures = []ReplicaFigures{{Replica: "kshard-0", Figures: []Figure{{Name: colRSSPeak, NoData: "no data"}}}}
	if c := memoryCheck(fleets, 512<<20, nil); c.Passed || !c.NoData {
		t.Errorf("no RSS read: %+v, want no data", c)
	}
}

// TestReadmeLink: a report in a folder under loadtest/results links to the
// guide as well as one in loadtest/results.
func TestReadmeLink(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Skip(err)
	}
	for out, want := range map[string]string{
		filepath.Join(root, "loadtest", "results"):           "../README.md",
		filepath.Join(root, "loadtest", "results", "single"): "../../README.md",
		t.TempDir(): "",
	} {
		if got := readmeFrom(out); got != want {
			t.Errorf("from %s: %q, want %q", out, got, want)
		}
	}
}

// TestRelistCheck: the relists after an API server restart pass when the
// server completed no more syncs than the audit log's informers may, also
// when they attempted more (attempts the server ended early); they fail on
// a planted excess of completed syncs, and with no data when the server's
// count was not read. A run without a restart has no such check.
func TestRelistCheck(t *testing.T) {
	if _, ok := (&WriteEvidence{}).relistCheck(); ok {
		t.Error("a run without an API server restart has a relist check")
	}
	w := &WriteEvidence{Relists: []RelistEvidence{{At: time.Minute}}}
	if c, _ := w.relistCheck(); c.Passed || !c.NoData {
		t.Errorf("a log without any sync: %+v", c)
	}
	counted := func(bindings float64) RelistEvidence {
		return RelistEvidence{At: time.Minute, For: time.Minute, Syncs: 40, Informers: 9,
			Excess:    []string{"kshard-1_ab synced configbindings … 5 times"},
			Completed: map[string]float64{"configbindings": bindings, "configmaps": 4, "externaldomains": 0},
			Allowed:   map[string]int{"configbindings": 9, "configmaps": 4}}
	}
	w = &WriteEvidence{Syncs: 30, Relists: []RelistEvidence{counted(9)}}
	if c, ok := w.relistCheck(); !ok || !c.Passed {
		t.Errorf("attempts beyond one per informer, syncs completed within: %+v", c)
	}
	w.Relists = append(w.Relists, counted(12))
	if c, _ := w.relistCheck(); c.Passed || !strings.Contains(c.Detail, "configbindings 12 of 9 allowed") {
		t.Errorf("a relist loop passed: %+v", c)
	}
	unread := counted(0)
	unread.Completed, unread.CountErr = nil, "no apiserver_watch_list_duration_seconds in the API server's /metrics"
	w.Relists = []RelistEvidence{unread}
	if c, _ := w.relistCheck(); c.Passed || !c.NoData || !strings.Contains(c.Detail, "apiserver_watch_list_duration_seconds") {
		t.Errorf("an unread count passed: %+v", c)
	}
}

// TestUnownedAcrossAnAPIServerRestart: a shard unowned beyond the bound
// while the API server was away is excused when it was held again within
// the bound after the server answered; one held later, or unowned with the
// server up, fails the check.
func TestUnownedAcrossAnAPIServerRestart(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	bound := 20 * time.Second
	outage := []apiServerRestart{{At: at(100), Ready: at(160), Settled: at(170)}}
	excused := []unownedInterval{{Shard: 1, From: at(110), To: at(175)}}
	if c := unownedCheck(excused, 10, bound, t0, outage); !c.Passed || !strings.Contains(c.Detail, "1 longer across an API server restart") {
		t.Errorf("an interval the outage explains: %+v", c)
	}
	for _, iv := range []unownedInterval{
		{Shard: 2, From: at(110), To: at(181)}, // held again 21 s after the server answered
		{Shard: 3, From: at(20), To: at(50)},   // the server up
		{Shard: 4, From: at(161), To: at(190)}, // unowned only after the server answered
	} {
		if c := unownedCheck(append([]unownedInterval{iv}, excused...), 10, bound, t0, outage); c.Passed {
			t.Errorf("shard %d unowned %s–%s passed: %+v", iv.Shard, iv.From.Sub(t0), iv.To.Sub(t0), c)
		}
	}
}

// TestRingPollOutlastsStop: a poll asked to stop goes on until the watch
// has delivered a Lease since, so that a watch still backing off after an
// API server restart does not leave every Lease looking expired; once the
// watch delivers, the poll ends.
func TestRingPollOutlastsStop(t *testing.T) {
	now := time.Now()
	proc := testProcess(now.Add(-time.Minute), 0, true)
	w := newRingState(Ring, sharding.DefaultShards, func(string, time.Time) *instance { return proc })
	var calls atomic.Int64
	w.list = func(context.Context) ([]coordinationv1.Lease, error) {
		calls.Add(1)
		return nil, nil
	}
	polls := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(t.Context(), ringPoll, time.Minute, true, func(context.Context) (bool, error) {
			return cond(), nil
		}); err != nil {
			t.Fatalf("%s: %d polls", what, calls.Load())
		}
	}
	stop := w.poll(t.Context())
	polls("the first poll", func() bool { return calls.Load() > 0 })
	stop()
	stop() // again, as a deferred stop does after an explicit one
	asked := calls.Load()
	polls("polls after stop, with the watch silent", func() bool { return calls.Load() >= asked+3 })

	l := shardLeaseObject(0, "kshard-0_a", now, now)
	l.ResourceVersion = "10"
	w.observe(l, false)
	// The poll ends at its next tick: the count holds still from then on.
	var last int64 = -1
	still := 0
	polls("the poll went on after the watch delivered", func() bool {
		n := calls.Load()
		if n == last {
			still++
		} else {
			last, still = n, 0
		}
		return still >= 20 // 20 checks, 2 s, with no poll: it ended
	})
}
