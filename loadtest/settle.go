package loadtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
)

// settlePoll is how often a settle checks the ring, the audit logs and the
// objects.
const settlePoll = 200 * time.Millisecond

// EventResult is how long the fleet took to settle after an event (a
// fleet's start, a crash, a join, a restart, a storm).
type EventResult struct {
	Name string
	// At is the event's time from the start of the run.
	At time.Duration
	// Held is the time from the event until every shard was held by the
	// running replica the ring assigns it (for sharding off: until every
	// replica was ready).
	Held time.Duration
	// Reconciled is the time from the event until every object of a shard
	// acquired since the event was reconciled by its new holder (from the
	// audit logs), and every object's latest generation was Ready.
	Reconciled time.Duration
	// Moved is the number of shards acquired since the event, and Objects
	// the objects in them.
	Moved, Objects int
	// MovedToOther counts the shards whose running holder when the event
	// settled differs from their running holder right before it (the last
	// ring tick at or before the event): Moved less the shards their holder
	// took back. -1 when not counted: a fleet without shards, or no shard
	// had a running holder before (a fleet's start).
	MovedToOther int
	// Handover says the event changed the ring's members; otherwise (a
	// storm of writes) Held is not meaningful.
	Handover bool
	// WritesCounted says the event's writes were counted: for events
	// without load whose start was marked (the run waited for a scrape of
	// the quiet before them), as under load the spec updates' writes would
	// drown the handover's. Figures are then the events queries of
	// queries/fleets.yaml over the event, from it until the first scrape
	// after the fleet settled: the object writes the API server served,
	// less the load tester's own. A handover that keeps each object's
	// ConfigMap and status as they are writes none.
	WritesCounted bool
	Figures       []Figure `json:",omitempty"`
	// Error says why it did not settle within the settle timeout.
	Error string `json:",omitempty"`
}

// startFleet starts n replicas of mode on the objects that exist, waits
// until they settle, and makes it the current fleet. The fleet's own
// numbers (heap, LISTs) count from here.
func (r *run) startFleet(ctx context.Context, mode Mode, n int) (*fleet, error) {
	return r.startFleetFor(ctx, mode, n, "")
}

// startFleetFor is startFleet for a fleet run for a purpose its label says.
func (r *run) startFleetFor(ctx context.Context, mode Mode, n int, purpose string) (*fleet, error) {
	f := &fleet{r: r, mode: mode}
	f.purpose = purpose
	if mode.Sharded() {
		n, err := r.shardTableDomains(ctx)
		if err != nil {
			return nil, err
		}
		f.tableDomains = n
	}
	f.sizes = []int{n}
	switch still, err := r.prom.awaitStill(ctx, scansQuery, scansStillFor, scansStillWithin); {
	case ctx.Err() != nil:
	case err != nil:
		r.log.Error(err, "Reading the API server's walks before a fleet's start")
	case !still:
		r.progress.printf("%s  the API server's count of ConfigBindings walked still moved after %s; going on", r.elapsed(), scansStillWithin)
	}
	r.spanStart(ctx)
	r.fleets.start(f)
	r.obs.setFleet(f.id, time.Now())
	r.mark("start %s", f.label())
	r.setPhase("starting")
	if err := f.scaleTo(ctx, n); err != nil {
		return f, err
	}
	ev := r.settleFrom(ctx, f, "start of "+f.label(), f.started, true, settleQuiet)
	f.startEvent, f.startObjects = ev, r.tracker.count()
	// Objects that existed before the fleet make its start its create
	// storm; without any, the scenario's creates will.
	f.storm = stormOfStart(ev, f.started, f.startObjects)
	if ev.Error != "" {
		return f, fmt.Errorf("%s: %s", ev.Name, ev.Error)
	}
	r.ring.setGuard(mode.Sharded())
	return f, nil
}

// stopFleet stops every replica of the fleet (they leave the ring and hand
// over) and computes its numbers.
func (r *run) stopFleet(ctx context.Context, f *fleet) {
	r.ring.setGuard(false)
	f.stopped = time.Now()
	r.setPhase("stopping %s", f.label())
	if err := f.scaleTo(ctx, 0); err != nil {
		r.progress.printf("stopping %s: %v", f.label(), err)
	}
	r.fleets.stopped(f)
	rp := reporter{r}
	f.result = rp.fleetResult(f)
	rp.measureFleet(ctx, f, f.result)
	r.obs.setFleet("", time.Time{})
	r.mark("stopped %s", f.label())
}

// settleKind says what an event changed, and so what settling means.
type settleKind int

const (
	// settleLoad follows writes that move no shard (creations, a storm of
	// updates): every object's latest generation Ready.
	settleLoad settleKind = iota
	// settleHandover follows a membership change under load: every shard
	// held by its desired running owner, every object of a shard acquired
	// since the event reconciled by its new holder. Objects being updated
	// need not all be Ready at one instant.
	settleHandover
	// settleQuiet is settleHandover without load, and every object Ready.
	settleQuiet
)

// settle waits until the fleet has settled after an event at since, and
// records the event. It gives up after the settle timeout and says what was
// missing.
func (r *run) settle(ctx context.Context, f *fleet, name string, since time.Time, kind settleKind) EventResult {
	return r.settleFrom(ctx, f, name, since, false, kind)
}

// settleFrom is settle for an event whose object writes are counted when
// countWrites (its caller waited for a scrape of the quiet before it, see
// run.spanStart).
func (r *run) settleFrom(ctx context.Context, f *fleet, name string, since time.Time, countWrites bool, kind settleKind) EventResult {
	r.setPhase("settling after %s", name)
	s := settler{ring: r.ring, tracker: r.tracker, audit: r.audit, prom: r.prom, log: r.log}
	ev, err := s.await(ctx, f, since, kind, r.opts.SettleTimeout)
	ev.Name, ev.At, ev.WritesCounted = name, since.Sub(r.begin), countWrites
	if err != nil {
		ev.Error = err.Error()
		return ev
	}
	r.report.addEvent(ev)
	if ev.Error == "" {
		r.progress.printf("%s  settled after %s: shards held after %s, objects reconciled after %s", r.elapsed(), name, round(ev.Held), round(ev.Reconciled))
	}
	return ev
}

// settler decides whether a fleet has settled after an event, from the
// ring's Leases, the replicas' audit logs, the objects and what the
// replicas export.
type settler struct {
	ring    *ringWatch
	tracker *tracker
	audit   *auditTail
	prom    *promServer
	log     logr.Logger
}

// await polls until the fleet has settled after an event at since, or
// timeout passed (the result's Error says what was missing). Its error
// is why ctx ended.
func (s *settler) await(ctx context.Context, f *fleet, since time.Time, kind settleKind, timeout time.Duration) (EventResult, error) {
	allReady := kind != settleHandover
	ev := EventResult{Handover: kind != settleLoad, MovedToOther: -1}
	var holdersBefore map[int32]string
	if f.mode.Sharded() {
		holdersBefore = s.ring.holdersAt(since)
	}
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: 2 * time.Second}
	var heldAt time.Time
	for {
		now := time.Now()
		var ok bool
		var detail string
		if f.mode.Sharded() {
			ok, detail, heldAt, ev = s.sharded(ctx, f, since, now, heldAt, ev)
		} else {
			ok, detail, heldAt = s.single(ctx, hc, f, since, now, heldAt)
		}
		if ok && allReady {
			if n, total, ex := s.tracker.notReady(); n > 0 {
				ok, detail = false, fmt.Sprintf("%d of %d objects not Ready at their latest generation, e.g. %s", n, total, ex[0])
			}
		}
		if ok {
			ev.Held = heldAt.Sub(since)
			ev.Reconciled = now.Sub(since)
			ev.MovedToOther = s.movedSince(holdersBefore, now)
			return ev, nil
		}
		if now.After(deadline) {
			ev.Error = fmt.Sprintf("%s after %s: %s", errSettle, timeout, detail)
			if !heldAt.IsZero() {
				ev.Held = heldAt.Sub(since)
			}
			ev.MovedToOther = s.movedSince(holdersBefore, now)
			return ev, nil
		}
		if err := sleep(ctx, settlePoll); err != nil {
			return ev, err
		}
	}
}

// movedSince counts the shards held by another replica now than before;
// -1 when no shard had a running holder before.
func (s *settler) movedSince(before map[int32]string, now time.Time) int {
	if len(before) == 0 {
		return -1
	}
	return movedToOther(before, s.ring.holdersNow(now))
}

// sharded checks a sharded fleet.
func (s *settler) sharded(ctx context.Context, f *fleet, since, now, heldAt time.Time, ev EventResult) (bool, string, time.Time, EventResult) {
	var running []string
	for _, sl := range f.runningSlots() {
		running = append(running, sl.id)
	}
	balanced, detail, moved := s.ring.balance(now, since, running)
	if !balanced {
		return false, detail, time.Time{}, ev
	}
	if heldAt.IsZero() {
		heldAt = now
	}
	if err := s.audit.poll(f.auditPaths()); err != nil {
		return false, err.Error(), heldAt, ev
	}
	byShard := s.tracker.byShard()
	if keys := byShard[-1]; len(keys) > 0 {
		return false, fmt.Sprintf("%d objects without a shard label (e.g. %s)", len(keys), keys[0]), heldAt, ev
	}
	ev.Moved, ev.Objects = len(moved), 0
	behind, example := 0, ""
	for n, m := range moved {
		for _, key := range byShard[n] {
			ev.Objects++
			if !s.audit.reconciledBy(key, m.holder, m.acquired) {
				behind++
				example = fmt.Sprintf("%s (shard %d, held by %s since %s)", key, n, m.holder, m.acquired.Format(time.StampMilli))
			}
		}
	}
	if behind > 0 {
		return false, fmt.Sprintf("%d of %d objects of moved shards not yet reconciled by their new holder, e.g. %s", behind, ev.Objects, example), heldAt, ev
	}
	if since.Equal(f.started) {
		// A new fleet's first reconciles find cold external caches and
		// wait; the values' arrival requeues the objects. The fleet has
		// settled when that second wave is done too, or its measured phase
		// would count the fleet's own warm-up.
		if depth := s.queueDepth(ctx, f); depth > 0 {
			return false, fmt.Sprintf("%.0f requests queued in the replicas", depth), heldAt, ev
		}
	}
	return true, "", heldAt, ev
}

// single checks a fleet with sharding off: every replica ready and,
// after the fleet's start, the replicas reconciled at least every object
// (their reconcile counters, sampled) with empty work queues and no key
// still being fetched into their external caches: the singleton's warm-up,
// which has no shards to tell moved objects by. A Ready binding whose keys
// are on their way is reconciled when they arrive, so a reconcile count
// and an empty queue alone end the warm-up early (the first runs of the
// scale scenario began the singleton's measured phase with 13,562 of its
// 16,000 keys still to fetch).
func (s *settler) single(ctx context.Context, hc *http.Client, f *fleet, since, now, heldAt time.Time) (bool, string, time.Time) {
	slots := f.runningSlots()
	for _, sl := range slots {
		if !ready(ctx, hc, sl.healthAddr) {
			return false, sl.id + " not ready", time.Time{}
		}
	}
	if heldAt.IsZero() {
		heldAt = now
	}
	if !since.Equal(f.started) {
		return true, "", heldAt
	}
	// Counted since the processes started, with the fleet.
	reconciles, _ := s.live(ctx, f.selector("controller_runtime_reconcile_total", `controller="`+controllerName+`"`))
	depth := s.queueDepth(ctx, f)
	objects := s.tracker.count()
	if reconciles < float64(objects) || depth > 0 {
		return false, fmt.Sprintf("%.0f reconciles of %d objects since the event, %.0f queued", reconciles, objects, depth), heldAt
	}
	fetching, ok := s.live(ctx, f.selector(metricFetches, `state=~"queued|calling|backoff"`))
	switch {
	case !ok && f.mode.externalCache():
		return false, "no " + metricFetches + " from the replicas: their warm-up cannot be seen", heldAt
	case fetching > 0:
		return false, fmt.Sprintf("%.0f keys still being fetched into the external caches", fetching), heldAt
	}
	return true, "", heldAt
}

// round is a duration rounded for people.
func round(d time.Duration) time.Duration {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond)
	case d < 10*time.Second:
		return d.Round(10 * time.Millisecond)
	default:
		return d.Round(100 * time.Millisecond)
	}
}

// queueDepth is the fleet's work-queue depth, summed over its replicas.
func (s *settler) queueDepth(ctx context.Context, f *fleet) float64 {
	depth, _ := s.live(ctx, f.selector("workqueue_depth", `name="`+controllerName+`"`))
	return depth
}

// live reads what q sums now (promServer.live); ok is false when it
// selects nothing, and a failed query is logged.
func (s *settler) live(ctx context.Context, q string) (float64, bool) {
	v, err := s.prom.live(ctx, q)
	if err != nil && !errors.Is(err, errNoData) && ctx.Err() == nil {
		s.log.Error(err, "Reading the fleet's state from Prometheus")
	}
	return v, err == nil
}

// ready reports whether a replica's /readyz answers 200.
func ready(ctx context.Context, hc *http.Client, addr string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// The replicas' metrics the load tester's own logic reads.
const (
	controllerName = "configbinding"
	metricFetches  = "kshard_external_fetches_in_flight"
)

// Bounds of the wait for scansQuery to hold still: how long the count must hold, and how long
// to wait for that at most.
const (
	scansStillFor    = 3 * time.Second
	scansStillWithin = time.Minute
)

// scansQuery is the API server's count of ConfigBindings walked, which a
// fleet's start waits to hold still: the server counts a watch-list's walk
// after its client is gone, and a consistency check's as it goes, and a
// start must not inherit the walks of the fleet before it.
const scansQuery = `sum(apiserver_storage_list_fetched_objects_total{job="apiserver",resource="configbindings"}) or vector(0)`

// awaitStill waits, at most within, until what q reads has held still for
// still, and says whether it did.
func (p *promServer) awaitStill(ctx context.Context, q string, still, within time.Duration) (bool, error) {
	var last float64
	since, deadline := time.Now(), time.Now().Add(within)
	for time.Now().Before(deadline) {
		n, err := p.scalar(ctx, q, time.Now())
		if err != nil {
			return false, err
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= still {
			return true, nil
		}
		if err := sleep(ctx, p.interval); err != nil {
			return false, err
		}
	}
	return false, nil
}
