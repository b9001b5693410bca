package loadtest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"
)

// scaleFirstReconcile is the fleet that reconciles the scale scenario's new
// objects once before the compared fleets start: the widest of them, so
// the storm ends soonest.
var scaleFirstReconcile = fleetSpec{Mode: ModeSharded, Replicas: 4}

// Goals of the scale scenario (docs/scale.md), set against kubernetes-
// controller-sharding's evaluation (a whole fleet's heap 1.24× the
// singleton's at 9,000 objects).
const (
	// goalHeap4 and goalHeap8 bound the largest replica's heap of a ×4 and a
	// ×8 fleet against the singleton's; goalFleetHeap the whole fleet's.
	goalHeap4, goalHeap8, goalFleetHeap = 0.30, 0.17, 1.15
	// goalLeave bounds a graceful leave from the signal until every moved
	// object was reconciled by its new owner; a crash is allowed the lease
	// duration more.
	goalLeave = 2 * time.Second
)

// runScale creates the objects with no fleet running, has one sharded fleet
// reconcile them once (the create storm at this size), then starts each
// compared fleet on the objects already there, Ready, as a controller that
// is restarted or redeployed finds them: its start is its initial syncs and
// a reconcile of every object that should write nothing. Each fleet runs
// the update load; a sharded fleet of several replicas then meets the
// handovers (graceful leave, join, crash, rejoin) with no load, so their
// writes are counted.
func runScale(ctx context.Context, r *run) error {
	specs := r.chosen
	r.concluders = append(r.concluders, func(ctx context.Context) { scaleFindings(ctx, r) })
	// The goals of the fleets that ran, also when a later one failed.
	if err := r.createAll(ctx, nil); err != nil {
		return err
	}
	first, err := r.startFleetFor(ctx, scaleFirstReconcile.Mode, scaleFirstReconcile.Replicas, "first reconcile")
	if err != nil {
		return err
	}
	r.stopFleet(ctx, first)
	for _, s := range specs {
		f, err := r.startFleet(ctx, s.Mode, s.Replicas)
		if err != nil {
			return err
		}
		if err := r.withLoad(ctx, f, r.opts.Duration, nil); err != nil {
			return err
		}
		if s.Mode.Sharded() && s.Replicas == restartFleet(specs) {
			if err := restartComparison(ctx, r, f); err != nil {
				return err
			}
		}
		if s.Mode.Sharded() && s.Replicas >= 2 {
			// The handovers count their writes: the updates' last
			// reconciles must be done first.
			r.settle(ctx, f, "end of the updates to "+f.label(), time.Now(), settleLoad)
			if err := quietHandovers(ctx, r, f); err != nil {
				return err
			}
		}
		if err := r.endFleet(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// restartFleet is the replica count of the sharded fleet whose API server
// restarts the scale scenario compares: the largest, whose relists are the
// most; 0 without a sharded fleet.
func restartFleet(specs []fleetSpec) int {
	n := 0
	for _, s := range specs {
		if s.Mode.Sharded() {
			n = max(n, s.Replicas)
		}
	}
	return n
}

// restartSettle is how long the comparison lets the fleet and the probe
// run before each restart, and after it settled.
const restartSettle = 15 * time.Second

// restartComparison restarts the API server twice under the fleet's update
// load: with deploy/base's kshard-syncs FlowSchema, so that the replicas'
// relists queue in a priority level of their own, and without it, so that
// they queue in workload-low with every other ServiceAccount's requests. A
// probe, another ServiceAccount's client, lists a few ConfigMaps every
// 100 ms throughout: its latency from the restart until the fleet settled is
// what the relists cost other clients. The relists themselves are checked
// against the API server's audit log (one sync per informer, noteRestart),
// and the updates sent meanwhile must all become Ready.
func restartComparison(ctx context.Context, r *run, f *fleet) error {
	if r.restartAPIServer == nil || r.fencing == nil {
		r.report.addFinding("API server restarts: not run (the load tester did not start the API server, or the replicas run without deploy/base's identity)")
		return nil
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	p, err := startProbe(ctx, r.c, r.restConfig)
	if err != nil {
		return err
	}
	perSecond := float64(r.gen.existing()) * r.opts.UpdateRate
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.gen.updateFor(ctx, 1<<62, perSecond)
	}()
	defer func() { stop(); <-done }()
	for _, withSchema := range []bool{true, false} {
		if err := restartUnder(ctx, r, f, p, withSchema); err != nil {
			return err
		}
	}
	// Deployed as deploy/base has it for what follows.
	return r.fencing.setFlowSchema(ctx, true)
}

// restartUnder restarts the API server once, with the replicas' FlowSchema
// or without it, and states what the probe and the updates saw.
func restartUnder(ctx context.Context, r *run, f *fleet, p *latencyProbe, withSchema bool) error {
	how := "with deploy/base's kshard-syncs FlowSchema (the replicas' syncs in their own priority level)"
	if !withSchema {
		how = "without the kshard-syncs FlowSchema (the replicas' syncs in workload-low, with the probe; their Lease requests keep kshard-leases)"
	}
	if err := r.fencing.setFlowSchema(ctx, withSchema); err != nil {
		return err
	}
	if err := sleep(ctx, restartSettle); err != nil {
		return err
	}
	steadyFrom := time.Now()
	r.mark("restart the API server, %s", map[bool]string{true: "with the FlowSchema", false: "without the FlowSchema"}[withSchema])
	stopPoll := r.ring.poll(ctx)
	at := time.Now()
	if err := r.restartAPIServer(ctx); err != nil {
		stopPoll()
		return err
	}
	ready := time.Now()
	ev := r.settle(ctx, f, fmt.Sprintf("restart of the API server %s, ready again after %s", how, round(ready.Sub(at))), at, settleHandover)
	stopPoll()
	settled := time.Now()
	r.faults.noteRestart(apiServerRestart{At: at, Ready: ready, Settled: settled})
	if err := sleep(ctx, restartSettle); err != nil {
		return err
	}
	r.faults.closeRestartWindow(ctx)
	steady, _ := p.between(steadyFrom.Add(-restartSettle), steadyFrom)
	during, failed := p.between(ready, settled.Add(restartSettle))
	updates, p99 := r.prom.updatesBetween(ctx, at, settled)
	settledText := "settled after " + fmtDur(ev.Reconciled)
	if ev.Error != "" {
		settledText = "not settled: " + ev.Error
	}
	r.report.addFinding(fmt.Sprintf("API server restart %s: %s; the probe (another ServiceAccount listing a few ConfigMaps every %s) "+
		"before it p50 %s, p99 %s (%d requests); from the server's readiness until %s after the fleet settled p50 %s, p99 %s, max %s (%d requests, %d failed); "+
		"spec updates Ready from the restart until the fleet settled: %s, p99 %s until Ready",
		how, settledText, probeInterval, fmtDur(steady.P50), fmtDur(steady.P99), steady.Count, restartSettle,
		fmtDur(during.P50), fmtDur(during.P99), fmtDur(during.Max), during.Count, failed, updates, p99))
	return nil
}

// scaleFindings states each goal of the scale scenario against what the run
// measured: the heap a sharded fleet divides, the objects its initial syncs
// scanned, and its handovers.
func scaleFindings(ctx context.Context, r *run) {
	var single *FleetResult
	for _, f := range r.fleets.list() {
		if f.result != nil && f.purpose == "" && f.mode.Name == ModeSingleton.Name && f.result.Replicas == 1 {
			single = f.result
		}
	}
	for _, f := range r.fleets.list() {
		res := f.result
		if res == nil || f.purpose != "" {
			continue
		}
		if f.mode.Sharded() && single != nil {
			for _, g := range heapGoals(res, single) {
				r.report.addFinding(g)
			}
		}
		r.report.addFinding(scanFinding(res, f.mode.Sharded()))
	}
	for _, ev := range r.report.Events {
		if g, ok := handoverGoal(ev, r.opts.LeaseDuration); ok {
			from := r.begin.Add(ev.At)
			api, okAPI := r.prom.cpuSeconds(ctx, jobAPIServer, from, from.Add(ev.Reconciled))
			etcd, okEtcd := r.prom.cpuSeconds(ctx, jobEtcd, from, from.Add(ev.Reconciled))
			if okAPI && okEtcd {
				secs := ev.Reconciled.Seconds()
				g += fmt.Sprintf("; meanwhile kube-apiserver used %.1f and etcd %.1f CPU-seconds (%.2f and %.2f cores of the machine's %d)",
					api, etcd, api/secs, etcd/secs, runtime.NumCPU())
			}
			r.report.addFinding(g)
		}
	}
}

// heapGoals compares a sharded fleet's heap with the singleton's: its
// largest replica at its peak and at the end of the load, and the whole
// fleet at the end of the load. The goals are judged on the live heap,
// what the replicas hold, where both fleets have it; the heap in use, which
// adds the garbage not yet collected at the scrape, is given beside it.
// Reports from before the load tester read the live heap judge the heap in
// use.
func heapGoals(f, single *FleetResult) []string {
	goal := map[int]float64{4: goalHeap4, 8: goalHeap8}[f.Replicas]
	var out []string
	for _, x := range []struct {
		what        string
		live, inUse string
		goal        float64
	}{
		{"largest replica's peak %s", figLiveHeapPeak, figHeapPeak, goal},
		{"largest replica's %s at the end of the load", figLiveHeapEnd, figHeapEnd, goal},
		{"whole fleet's %s at the end of the load", figLiveHeapEndSum, figHeapEndSum, goalFleetHeap},
	} {
		a, _ := f.value(x.live)
		b, _ := single.value(x.live)
		measure := "live heap"
		ia, _ := f.value(x.inUse)
		ib, _ := single.value(x.inUse)
		inUse := fmt.Sprintf("; heap in use %s", heapRatioText(ia, ib))
		if a <= 0 || b <= 0 {
			a, b, measure, inUse = ia, ib, "heap in use", ""
		}
		head := f.Fleet + ": " + fmt.Sprintf(x.what, measure)
		switch {
		case a <= 0 || b <= 0:
			out = append(out, fmt.Sprintf("%s ÷ %s's: no data", head, single.Fleet))
		case x.goal == 0:
			out = append(out, fmt.Sprintf("%s = %s %s's (no goal at this size)%s", head, heapRatioText(a, b), single.Fleet, inUse))
		default:
			out = append(out, fmt.Sprintf("%s = %s %s's: goal ≤ %.2f×, %s%s", head, heapRatioText(a, b), single.Fleet, x.goal, metText(a/b <= x.goal), inUse))
		}
	}
	return out
}

// heapRatioText writes a heap's ratio to another and both, "0.25× (1 MiB
// against 4 MiB)".
func heapRatioText(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "no data"
	}
	return fmt.Sprintf("%.2f× (%s against %s)", a/b, formatBytes(a), formatBytes(b))
}

// scanFinding states how many times the API server scanned each object for
// a fleet's initial syncs, against N+1 for N replicas and the labeler's
// cache.
func scanFinding(f *FleetResult, sharded bool) string {
	per, ok := f.value(figStartWalked)
	syncs, _ := f.value(figStartSyncs)
	if !ok {
		return fmt.Sprintf("%s: objects walked for the initial syncs of its start: no data", f.Fleet)
	}
	if !sharded {
		return fmt.Sprintf("%s: its start walked each object %.2f times (%.0f syncs)", f.Fleet, per, syncs)
	}
	bound := float64(f.Replicas + 1)
	return fmt.Sprintf("%s: its start (every replica at once) walked each object %.2f times (%.0f syncs): goal ≤ N+1 = %.0f, %s",
		f.Fleet, per, syncs, bound, metText(per <= bound))
}

// handoverGoal states a graceful leave's or a crash's settle time against
// its goal, and a leave's object writes against 0.
func handoverGoal(ev EventResult, lease time.Duration) (string, bool) {
	var goal time.Duration
	switch {
	case strings.HasPrefix(ev.Name, "graceful scale-down"):
		goal = goalLeave
	case strings.HasPrefix(ev.Name, "crash of"):
		goal = lease + goalLeave
	default:
		return "", false
	}
	if ev.Error != "" {
		return fmt.Sprintf("%s: not settled (%s): goal ≤ %s, not met", ev.Name, ev.Error, goal), true
	}
	writes := "object writes not counted"
	for _, x := range ev.Figures {
		if x.Name == figEventWrites && x.NoData == "" {
			writes = fmt.Sprintf("%.0f object writes (goal 0: %s)", x.Value, metText(x.Value == 0))
		}
	}
	return fmt.Sprintf("%s at %s: every moved object (%d in %d shards) reconciled by its new owner %s after the signal: goal ≤ %s, %s; "+
		"every shard held by its new owner after %s, the last object reconciled %s after that; %s",
		ev.Name, fmtDur(ev.At), ev.Objects, ev.Moved, fmtDur(ev.Reconciled), goal, metText(ev.Reconciled <= goal),
		fmtDur(ev.Held), fmtDur(ev.Reconciled-ev.Held), writes), true
}

func metText(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}
