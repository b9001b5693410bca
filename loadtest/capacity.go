package loadtest

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// The capacity search and its objectives.
const (
	// capacityObjective bounds both the p99 of update → Ready and the p99
	// of the work-queue wait in a window that holds.
	capacityObjective = time.Second
	// capacityStep is the factor of the ramp until one window holds and
	// one misses; capacityBisections then halves the bracket (geometrically)
	// this many times: the capacity is known within a factor of
	// capacityStep^(1/2^capacityBisections), 1.026.
	capacityStep       = 1.5
	capacityBisections = 4
	// capacityMaxRates bounds the rates one fleet's search decides.
	capacityMaxRates = 16
	// capacityMinRate is the lowest rate tried: a fleet that misses the
	// objectives below it has no capacity worth searching.
	capacityMinRate = 0.5
	// capacityStartShare starts a later fleet at this share of n times the
	// first fleet's capacity: below it, so that its first window likely
	// holds and the next (× capacityStep) misses.
	capacityStartShare = 0.9
	// capacityRest separates windows, so that one's CPU and queue figures
	// do not reach into the next.
	capacityRest = 3 * time.Second
	// capacityIdle is how long a fleet's CPU is measured with no load
	// before its search.
	capacityIdle = 15 * time.Second
	// goalLinear is the goal for the largest fleet: its capacity
	// at least this share of n times one replica's.
	goalLinear = 0.90
	// maxLinear bounds every fleet's share of linear: n replicas cannot do
	// more than n times one replica's work, so a fleet above it says the
	// first fleet was bound by something other than reconciling (its
	// Leases, its quota's throttling), and its capacity is no baseline.
	maxLinear = 1.05
)

// CapacityResult is one fleet's capacity: the highest spec-update rate at
// which a window of the load still held both objectives.
type CapacityResult struct {
	Fleet    string
	Replicas int
	// Capacity is the highest rate (updates/s) whose window held; 0 when
	// none did. Missed is the lowest rate that missed, 0 when none did: the
	// capacity lies in [Capacity, Missed).
	Capacity, Missed float64
	// SharesMax is the largest replica's objects divided by the mean, at
	// the end of the search: a fleet is as fast as its busiest replica.
	SharesMax float64
	// IdleCores is the CPU the replicas used together with no load, before
	// the search (Lease renewals, the load tester's scrapes, the Go
	// runtime): the part of each replica's quota no update gets. -1
	// without data. Idle are that span's figures (queries/capacity.yaml):
	// the Lease writes per second then, and the CPU per write.
	IdleCores float64
	Idle      []Figure
	Windows   []CapacityWindow
}

// CapacityWindow is one window of load at one rate.
type CapacityWindow struct {
	// Rate is the rate asked (updates/s); Sent the updates sent in the
	// window, Ready those that became Ready at their generation (or a
	// later one) before the wait after it ended.
	Rate        float64
	Sent, Ready int
	// P99 is update → Ready of the window's updates.
	P99 time.Duration
	// QueueWithin is the share of the replicas' work-queue waits within
	// the objective (workqueue_queue_duration_seconds, whose buckets end at
	// 1 s); -1 without data.
	QueueWithin float64
	// ReplicaCores and APIServerCores are the CPU the replicas (together)
	// and kube-apiserver used, in cores; Throttled the share of the
	// replicas' CFS periods that ended with the quota spent. -1 without
	// data.
	ReplicaCores, APIServerCores, Throttled float64
	// SharesMax is the largest replica's objects divided by the mean at
	// the window's end: how evenly the ring spread them.
	SharesMax float64
	// Held says both objectives held; Why says which was missed.
	Held bool
	Why  string `json:",omitempty"`
	// Figures are the window's queries (queries/capacity.yaml).
	Figures []Figure
}

// runCapacity finds each fleet's capacity in turn, on the same objects.
func runCapacity(ctx context.Context, r *run) error {
	specs := r.chosen
	defer capacityFindings(r)
	if err := r.createAll(ctx, nil); err != nil {
		return err
	}
	var first *CapacityResult
	for _, s := range specs {
		f, err := r.startFleet(ctx, s.Mode, s.Replicas)
		if err != nil {
			return err
		}
		start := r.opts.UpdateRate * float64(r.opts.Objects)
		if first != nil && first.Capacity > 0 {
			start = capacityStartShare * float64(s.Replicas) * first.Capacity / float64(first.Replicas)
		}
		r.beginLoad(ctx, f)
		res, err := findCapacity(ctx, r, f, start)
		r.endLoad(ctx, f)
		r.mu.Lock()
		r.report.Capacity = append(r.report.Capacity, res)
		r.mu.Unlock()
		if err != nil {
			return err
		}
		if first == nil {
			first = &res
		}
		if err := r.endFleet(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// findCapacity ramps the rate by capacityStep from start until one window
// held and one missed, then bisects the bracket.
func findCapacity(ctx context.Context, r *run, f *fleet, start float64) (CapacityResult, error) {
	res := CapacityResult{Fleet: f.label(), Replicas: f.size(), IdleCores: -1}
	r.setPhase("%s with no load", f.label())
	from := r.spanStart(ctx)
	if err := sleep(ctx, capacityIdle); err != nil {
		return res, err
	}
	to := time.Now()
	if err := r.prom.caughtUp(ctx, to.Add(r.opts.SampleInterval)); err != nil {
		return res, err
	}
	res.Idle = r.prom.figures(ctx, r.queries.Idle, queryWindow{fleet: f.id, step: r.opts.SampleInterval, sharded: f.mode.Sharded(),
		spans: map[string]span{"idle": {from: from, to: to}}})
	for _, x := range res.Idle {
		if x.Name == idleCores && x.NoData == "" {
			res.IdleCores = x.Value
		}
	}
	window := func(rate float64) (bool, error) {
		w, err := capacityWindow(ctx, r, f, rate)
		if err != nil {
			return false, err
		}
		res.Windows = append(res.Windows, w)
		r.progress.printf("%s  %s at %.1f updates/s: p99 %s, work-queue waits within %s %s: %s",
			r.elapsed(), f.label(), rate, fmtDur(w.P99), capacityObjective, pct(w.QueueWithin), map[bool]string{true: "held", false: "missed (" + w.Why + ")"}[w.Held])
		return w.Held, nil
	}
	var err error
	res.Capacity, res.Missed, err = capacitySearch(start, window)
	if err != nil {
		return res, err
	}
	if n := len(res.Windows); n > 0 {
		res.SharesMax = res.Windows[n-1].SharesMax
	}
	return res, nil
}

// capacitySearch finds the highest rate whose windows hold, from start: it
// ramps the rate by capacityStep until one rate held and one missed, then
// bisects the bracket capacityBisections times. A rate is decided by two
// windows that agree, or by the third when they do not: on a shared
// machine one slow window must not cap a fleet's capacity, nor one lucky
// window raise it. capacity is the highest rate that held (0 when none
// did), missed the lowest that missed above it (0 when none did).
func capacitySearch(start float64, window func(rate float64) (bool, error)) (capacity, missed float64, err error) {
	decide := func(rate float64) (bool, error) {
		var held, runs int
		for runs < 3 && held < 2 && runs-held < 2 {
			ok, err := window(rate)
			if err != nil {
				return false, err
			}
			runs++
			if ok {
				held++
			}
		}
		return held >= 2, nil
	}
	try := func(rate float64) error {
		held, err := decide(rate)
		switch {
		case err != nil:
			return err
		case held:
			capacity = rate
		default:
			missed = rate
		}
		return nil
	}
	rates := 0
	rate := start
	for (capacity == 0 || missed == 0) && rates < capacityMaxRates && rate >= capacityMinRate {
		if err := try(rate); err != nil {
			return capacity, missed, err
		}
		rates++
		switch {
		case missed == 0:
			rate *= capacityStep
		case capacity == 0:
			rate /= capacityStep
		}
	}
	for i := 0; i < capacityBisections && capacity > 0 && missed > 0 && rates < capacityMaxRates; i++ {
		if err := try(math.Sqrt(capacity * missed)); err != nil {
			return capacity, missed, err
		}
		rates++
	}
	return capacity, missed, nil
}

// capacityWindow runs the update load at rate for the window (the run's
// duration), waits until every update sent became Ready (bounded by the
// settle timeout), and judges the window by its updates' p99 and the
// replicas' work-queue waits.
func capacityWindow(ctx context.Context, r *run, f *fleet, rate float64) (CapacityWindow, error) {
	w := CapacityWindow{Rate: rate, QueueWithin: -1, ReplicaCores: -1, APIServerCores: -1, Throttled: -1}
	r.setPhase("%s at %.1f updates/s", f.label(), rate)
	r.mark("%s: %.1f updates/s", f.label(), rate)
	from := r.spanStart(ctx)
	r.gen.updateFor(ctx, r.opts.Duration, rate)
	deadline := time.Now().Add(r.opts.SettleTimeout)
	for {
		n, _, _ := r.tracker.notReady()
		if n == 0 || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, settlePoll); err != nil {
			return w, err
		}
	}
	done := time.Now()
	if err := r.prom.caughtUp(ctx, done.Add(r.opts.SampleInterval)); err != nil {
		return w, err
	}
	qw := queryWindow{fleet: f.id, step: r.opts.SampleInterval, sharded: f.mode.Sharded(), spans: map[string]span{"window": {from: from, to: done}}}
	fig := map[string]Figure{}
	for _, x := range r.prom.figures(ctx, r.queries.Windows, qw) {
		fig[x.Name] = x
		w.Figures = append(w.Figures, x)
	}
	value := func(name string, into *float64) bool {
		x := fig[name]
		if x.NoData == "" {
			*into = x.Value
		}
		return x.NoData == ""
	}
	var sent, ready, p99 float64
	value(winSent, &sent)
	value(winReady, &ready)
	hasP99 := value(winP99, &p99)
	w.Sent, w.Ready, w.P99 = int(math.Round(sent)), int(math.Round(ready)), time.Duration(p99*float64(time.Second))
	value(winQueue, &w.QueueWithin)
	value(winReplicaCores, &w.ReplicaCores)
	value(winAPICores, &w.APIServerCores)
	value(winThrottled, &w.Throttled)
	value(winShares, &w.SharesMax)
	switch {
	case w.Sent == 0:
		w.Why = "no update sent"
	case w.Ready < w.Sent:
		w.Why = fmt.Sprintf("%d of %d updates not Ready %s after the window", w.Sent-w.Ready, w.Sent, r.opts.SettleTimeout)
	case !hasP99:
		w.Why = "no update → Ready latency read"
	case w.P99 > capacityObjective:
		w.Why = fmt.Sprintf("update → Ready p99 %s", fmtDur(w.P99))
	case w.QueueWithin < 0:
		w.Why = "no work-queue wait read"
	case w.QueueWithin < 0.99:
		w.Why = fmt.Sprintf("%s of work-queue waits within %s", pct(w.QueueWithin), capacityObjective)
	default:
		w.Held = true
	}
	return w, sleep(ctx, capacityRest)
}

// The window figures (queries/capacity.yaml) a window is judged by, and
// the idle figures the report shows; TestQueriesParse holds them to the
// file.
const (
	winSent         = "updates sent"
	winReady        = "updates Ready"
	winP99          = "update → Ready p99"
	winQueue        = "work-queue waits within 1 s"
	winReplicaCores = "replicas' CPU (cores)"
	winAPICores     = "kube-apiserver CPU (cores)"
	winThrottled    = "CFS periods throttled"
	winShares       = "largest replica's objects ÷ the mean"
	idleCores       = "replicas' CPU with no load (cores)"
	idleLeaseWrites = "Lease writes per second with no load (API server)"
	idleCPUPerWrite = "replicas' CPU per Lease write with no load, at most"
)

// capacityFindings states each fleet's capacity against n times the first
// fleet's, per replica, and the goal for the largest; a check fails when a
// fleet is above linear (the baseline is wrong) or the largest below the
// goal.
func capacityFindings(r *run) {
	check := fmt.Sprintf("scale-out: every fleet at most %.2f of linear, the largest at least %.2f", maxLinear, goalLinear)
	caps := r.report.Capacity
	if len(caps) == 0 || caps[0].Capacity <= 0 {
		r.report.addFinding("capacity: the first fleet held no window, so no fleet's capacity can be divided by it")
		r.report.addCheck(noDataCheck(check, "the first fleet held no window"))
		return
	}
	base := caps[0]
	per := base.Capacity / float64(base.Replicas)
	largest := 0
	for _, c := range caps {
		largest = max(largest, c.Replicas)
	}
	var failed []string
	for _, c := range caps[1:] {
		if c.Capacity <= 0 {
			r.report.addFinding(fmt.Sprintf("%s: no window held", c.Fleet))
			failed = append(failed, c.Fleet+" held no window")
			continue
		}
		eff := c.Capacity / (per * float64(c.Replicas))
		// The bracket of each capacity bounds the ratio.
		lo, hi := eff, eff
		if c.Missed > 0 {
			hi = c.Missed / (per * float64(c.Replicas))
		}
		if base.Missed > 0 {
			lo = c.Capacity / (base.Missed / float64(base.Replicas) * float64(c.Replicas))
		}
		s := fmt.Sprintf("%s: capacity %.1f updates/s = %.2f of %d × %s's %.1f per replica (between %.2f and %.2f by the brackets of both searches); its largest replica held %.2f× the mean share of objects",
			c.Fleet, c.Capacity, eff, c.Replicas, base.Fleet, per, lo, hi, c.SharesMax)
		if eff > maxLinear {
			s += fmt.Sprintf(": above %.2f of linear, which %d replicas cannot do: %s was bound by something other than reconciling, so its capacity is no baseline", maxLinear, c.Replicas, base.Fleet)
			failed = append(failed, fmt.Sprintf("%s at %.2f of linear", c.Fleet, eff))
		}
		if c.Replicas == largest {
			s += fmt.Sprintf(": goal ≥ %.2f of linear, %s", goalLinear, metText(eff >= goalLinear))
			if eff < goalLinear {
				failed = append(failed, fmt.Sprintf("%s at %.2f of linear, below %.2f", c.Fleet, eff, goalLinear))
			}
		}
		r.report.addFinding(s)
	}
	if len(failed) > 0 {
		r.report.addCheck(Check{Name: check, Detail: strings.Join(failed, "; ")})
		return
	}
	r.report.addCheck(Check{Name: check, Passed: true, Detail: fmt.Sprintf("every fleet within %.2f of linear, the largest at least %.2f", maxLinear, goalLinear)})
}
