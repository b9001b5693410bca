package loadtest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/replica"
)

// scenario is one named run: what it is, the defaults it brings, and the
// phases it runs (run). The scenarios are data: the table scenarioList.
type scenario struct {
	name string
	// doc says what the scenario does, for the report and the help.
	doc string
	// gate makes the checks decide the exit code.
	gate bool
	// faults says the scenario injects the chaos faults (kill, pause,
	// clock offset), so their options are validated.
	faults bool
	// splitKeys reserves half of every domain's keys for a later phase
	// (keys no object read before).
	splitKeys bool
	// defaults are the scenario's own defaults, set on the zero fields of
	// the options before the load tester's (documented on Options).
	defaults Options
	// derive sets the scenario's defaults that follow from other options,
	// after defaults; nil for none.
	derive func(*Options)
	// noLoad says the scenario runs no continuous update load.
	noLoad bool
	// plain says the scenario runs a fleet of a plain mode, so the run
	// builds cmd/plaincontroller (or finds it in --bin-dir).
	plain bool
	// fleets says the scenario compares fleets, whose list --fleets may
	// replace.
	fleets bool
	// pods says the scenario runs on a StatefulSet's pods too
	// (Options.StatefulSet): one sharded fleet, no process-only fault.
	pods bool
	run  func(context.Context, *run) error
	// findings states the scenario's goals against the run once every
	// figure is in; nil for none.
	findings func(context.Context, *run)
}

// ScenarioInfo names and describes a scenario, for help texts.
type ScenarioInfo struct {
	Name, Doc string
	// Defaults are the options the scenario sets itself where the caller
	// left them zero, as "Field=value": the flag help cannot list them
	// all in one line.
	Defaults []string
}

// Scenarios lists the scenarios, sorted by name.
func Scenarios() []ScenarioInfo {
	out := make([]ScenarioInfo, 0, len(scenarioList))
	for _, s := range scenarioList {
		info := ScenarioInfo{Name: s.name, Doc: s.doc}
		v := reflect.ValueOf(s.defaults)
		for i := range v.NumField() {
			if f := v.Field(i); !f.IsZero() {
				info.Defaults = append(info.Defaults, fmt.Sprintf("%s=%v", v.Type().Field(i).Name, f.Interface()))
			}
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// fleetSpec is one column of a comparison.
type fleetSpec struct {
	Mode     Mode
	Replicas int
	// ColdTable deletes the labeler's shard table before the fleet starts,
	// so that its create storm is labeled by the labeler, not at admission
	// (what a storm of domains the cluster has never seen costs).
	ColdTable bool
}

// shardingFleets are the columns of compare-sharding, in the order they
// run. The classic single active replica (sharding off) runs first: it is
// the base of the report's ratios. The first sharded fleet runs on a cold
// shard table (deleted before it starts: every object of its storm waits
// for the labeler) and fills it; the sharded fleets after it find every
// domain in it, as on a cluster whose domains exist, and their objects are
// labeled at their CREATE. The plain controller-runtime controller, the
// floor every kshard fleet must beat, runs last: the ConfigMap fields it
// writes stay owned by it, and a kshard fleet after it would pay to remove
// them (a merge patch per rotated key), which is a migration's cost, not
// the fleet's.
var shardingFleets = []fleetSpec{{Mode: ModeSingleton, Replicas: 1}, {Mode: ModeSharded, Replicas: 2, ColdTable: true}, {Mode: ModeSharded, Replicas: 2}, {Mode: ModeSharded, Replicas: 4}, {Mode: ModePlain, Replicas: 1}}

// hasPlain says whether a list of fleets includes a plain mode.
func hasPlain(specs []fleetSpec) bool {
	return slices.ContainsFunc(specs, func(s fleetSpec) bool { return s.Mode.Plain })
}

// externalModes are the columns of compare-external, each run with the
// scenario's replica count.
var externalModes = []Mode{ModeCache, ModeMirror, ModeDirect}

// scenarioList is every scenario the load tester runs.
var scenarioList = []*scenario{{
	name: "basic",
	pods: true,
	doc: "A sharded fleet (default 3 replicas) starts; the objects are created at the create rate (labeled at " +
		"CREATE by the API server, or by the labeler for a domain new to the shard table; their shards' holders " +
		"reconcile them); then spec updates run for the duration. " +
		"The steady-state baseline the other scenarios are read against.",
	run: func(ctx context.Context, r *run) error { return r.underLoad(ctx, r.opts.Replicas, nil) },
}, {
	name: "scale-out",
	doc: "One sharded replica takes the objects, then the fleet grows to 2 and to 4 replicas in steps under " +
		"continuous spec updates; each join is a handover measured from the new process's start.",
	defaults: Options{Duration: 90 * time.Second},
	run:      func(ctx context.Context, r *run) error { return r.underLoad(ctx, 1, r.scaleOut) },
}, {
	name:   "chaos",
	gate:   true,
	faults: true,
	pods:   true,
	doc: "Under continuous spec updates, a fault on a random replica every chaos interval, in rotation: a kill " +
		"(SIGKILL, restarted with the same identity after the restart delay, like a StatefulSet pod), a pause " +
		"(SIGSTOP past its Leases' expiry, default lease duration + 2 × retry period, then SIGCONT: its shards are " +
		"taken over while it cannot notice), a clock offset (restarted after SIGTERM with the times it writes " +
		"into Leases 30s ahead, the next time 30s behind, kept until another fault restarts it), a delay (what it " +
		"sends to the API server held past its Leases' expiry by a proxy, then delivered: the API server must refuse " +
		"the late writes), a partition (both ways of that connection held as long, then healed) and a restart of " +
		"the API server (every watch breaks: each informer may relist once). Fails on any " +
		"write outside its writer's tenure of the shard's Lease, any overlapping reconciles a pause does not " +
		"explain, any informer relisting more than once after an API server restart, any generation never Ready, any shard without a running holder for longer than lease duration " +
		"+ retry period, or a replica above its memory limit. On a StatefulSet's pods (--statefulset) the faults " +
		"are a forced pod deletion (grace 0) and a deletion with the pod's grace period, in rotation; the StatefulSet " +
		"recreates the pod at once.",
	// Two rotations of the six faults, each an interval, its own length
	// and a settle apart.
	defaults: Options{Duration: 12 * time.Minute},
	run:      runChaos,
}, {
	name: "rolling-restart",
	gate: true,
	doc: "Under continuous spec updates, every replica in turn, highest ordinal first, gets SIGTERM and is started " +
		"again with the same identity, as a StatefulSet rolling update does: it releases its shards but keeps its " +
		"place in the ring, and reclaims them on return. Fails like chaos (it has no pause, so any overlapping " +
		"reconciles fail it).",
	run: func(ctx context.Context, r *run) error { return r.underLoad(ctx, r.opts.Replicas, r.rollingRestart) },
}, {
	name: "resync-storm",
	doc: "Every object reconciled at once, twice: first every object's spec is updated as fast as the load " +
		"tester's workers go (a storm of spec changes), then every replica is restarted at once (SIGTERM to all, " +
		"then all started again: each relists its shards and reconciles every object). Each storm is timed until " +
		"every object is Ready again.",
	noLoad:   true,
	defaults: Options{Objects: 3000},
	run:      runResyncStorm,
}, {
	name:      "external-outage",
	splitKeys: true,
	doc: "Under continuous spec updates, the config center answers 503 to every data request for a while, then " +
		"recovers. During the outage updates switch to keys no object read before, so they cannot be served from " +
		"the cache: those objects must say ExternalUnavailable while every ConfigMap keeps its last " +
		"data, and all must become Ready by themselves after recovery.",
	defaults: Options{Duration: 90 * time.Second},
	derive: func(o *Options) {
		if o.OutageFor == 0 {
			o.OutageAfter, o.OutageFor = o.Duration/3, o.Duration/3
		}
	},
	run: func(ctx context.Context, r *run) error { return r.underLoad(ctx, r.opts.Replicas, r.outage) },
}, {
	name:   "compare-sharding",
	plain:  hasPlain(shardingFleets),
	fleets: true,
	doc: "Side by side on the same objects and load: the classic single active replica (--sharding=off, one " +
		"cache of every object), 2 sharded replicas on a cold shard table, 2 and 4 on a filled one, and a plain " +
		"controller-runtime controller with no kshard code (cmd/plaincontroller: one replica, one cache of " +
		"everything, synchronous config-center calls; the floor). Time from each fleet's start until it " +
		"reconciled every object, heap per replica, objects listed and held per replica, LISTs the API server " +
		"served, end-to-end latency and throughput.",
	defaults: Options{Objects: 5000, UpdateRate: 0.01},
	run:      func(ctx context.Context, r *run) error { return r.compare(ctx, shardingFleets) },
}, {
	name: "compare-external",
	doc: "Side by side on the same objects and load, with a slow config center (default 50 ms per call), the three " +
		"external-data strategies: the external cache (reconcile never waits on the config center), ExternalDomain " +
		"mirrors (values in the API server, written by each domain's shard holder), and direct calls inside " +
		"Reconcile. Config-center calls, API-server writes, reconcile p99, end-to-end p99, and how fast a " +
		"config-center change reaches the ConfigMaps (one changed key every 2 s).",
	defaults: Options{Latency: 50 * time.Millisecond, UpdateRate: 0.05, ValueChangeInterval: 2 * time.Second},
	fleets:   true,
	run: func(ctx context.Context, r *run) error {
		specs := make([]fleetSpec, 0, len(externalModes))
		for _, m := range externalModes {
			specs = append(specs, fleetSpec{Mode: m, Replicas: r.opts.Replicas})
		}
		return r.compare(ctx, specs)
	},
}, {
	name:   "scale",
	plain:  hasPlain(scaleFleets),
	fleets: true,
	doc: "At the scale that needs sharding (default 100,000 objects over 1,000 domains): the objects are created " +
		"with no fleet running and reconciled once by a sharded ×4 fleet (the create storm at this size); then " +
		"sharding off ×1, sharded ×4, sharded ×8 and the plain controller-runtime controller each start on them, " +
		"Ready, as a restarted controller finds them (every replica at once), run 100 spec updates/s, and the " +
		"sharded fleets meet a graceful leave, a join, a crash and a rejoin with no load. Per fleet: start → every " +
		"object reconciled, heap of the largest replica and of the whole fleet against the singleton's, the objects " +
		"the API server scanned for the start's initial syncs, the control plane's memory, Lease writes, " +
		"end-to-end latency; the goals are stated as findings.",
	defaults: Options{Objects: 100_000, Domains: 1000, CreateRate: recreateRate,
		// The singleton caches every object: deploy/base's 512Mi is sized
		// for a replica's share, not for 100,000 objects.
		MemoryLimit: "4Gi",
		// The first reconcile of 100,000 objects writes 200,000 times.
		SettleTimeout: 30 * time.Minute},
	derive:   func(o *Options) { defaultUpdates(o, scaleUpdatesPerSec) },
	run:      runScale,
	findings: func(ctx context.Context, r *run) { r.scaleFindings(ctx) },
}, {
	name:   "capacity",
	fleets: true,
	noLoad: true,
	defaults: Options{Duration: 30 * time.Second,
		// The objects' count matters little to a rate of updates; each
		// fleet's start reconciles all of them on its quota.
		Objects: 2000,
		// Many domains, so that a replica's share of the objects is close
		// to its share of the shards: the ring balances shards, and a
		// domain is never split.
		Domains: 1000,
		// Below it, a replica holding all 64 shards misses Lease renewals
		// during its first reconciles (at 25m it was fenced 479 times in
		// its first minutes and never settled).
		ReplicaCPU: "50m",
		// Each scrape costs the replica CPU of its quota; Prometheus
		// scrapes every 15–30 s.
		SampleInterval: 5 * time.Second},
	derive: func(o *Options) { defaultUpdates(o, capacityStartRate) },
	doc: "Scale-out efficiency: each replica held to the same CPU quota (--replica-cpu, default 50m, a cgroup " +
		"of its own), so that the replicas and not the API server are the bottleneck, sharded fleets of 1, 2, 4 " +
		"and 5 replicas each find the highest spec-update rate at which a window of load (--duration, default " +
		"30s) holds update → Ready p99 ≤ 1s and work-queue wait p99 ≤ 1s; each capacity is divided by the " +
		"replicas times the first fleet's per replica (goal for the largest: ≥ 0.90 of linear).",
	run: runCapacity,
}, {
	name: "handover",
	doc: "Handover times with many objects (default 10,000) and no other load: a graceful scale-down 3 → 2 " +
		"(SIGTERM to the highest ordinal after the StatefulSet's count drops, so it leaves the ring), a " +
		"scale-up 2 → 3 (join), and a crash (SIGKILL, not restarted: the survivors take its shards when its " +
		"Leases expire), then its rejoin.",
	noLoad: true,
	defaults: Options{Objects: 10000, CreateRate: 500,
		// The first reconcile of 10,000 objects writes 10,000 ConfigMaps
		// and statuses: minutes on a small machine.
		SettleTimeout: 10 * time.Minute},
	run: runHandover,
}}

// scenarios are the scenarios by name.
var scenarios = func() map[string]*scenario {
	m := make(map[string]*scenario, len(scenarioList))
	for _, s := range scenarioList {
		m[s.name] = s
	}
	return m
}()

// defaultUpdates sets a default update rate of perSecond spec updates in
// all, whatever the object count.
func defaultUpdates(o *Options, perSecond float64) {
	if o.UpdateRate == 0 {
		o.UpdateRate = perSecond / float64(o.Objects)
	}
}

// underLoad is a scenario of one sharded fleet of n replicas: it starts,
// the objects are created (its create storm), spec updates run for the
// duration while actions (nil for none) run, and every object settles.
func (r *run) underLoad(ctx context.Context, n int, actions func(context.Context, *fleet) error) error {
	f, err := r.startFleet(ctx, ModeSharded, n)
	if err != nil {
		return err
	}
	if err := r.createAll(ctx, f); err != nil {
		return err
	}
	var act func(context.Context) error
	if actions != nil {
		act = func(ctx context.Context) error { return actions(ctx, f) }
	}
	if err := r.withLoad(ctx, f, r.opts.Duration, act); err != nil {
		return err
	}
	return r.endFleet(ctx, f)
}

// scaleOut grows the fleet to 2, then 4 replicas, a third of the duration
// apart, each join a handover.
func (r *run) scaleOut(ctx context.Context, f *fleet) error {
	step := r.opts.Duration / 3
	for _, n := range []int{2, 4} {
		if err := sleep(ctx, step); err != nil {
			return err
		}
		from := f.size()
		at := time.Now()
		r.mark("scale %d → %d", from, n)
		if err := f.scaleTo(ctx, n); err != nil {
			return err
		}
		r.handover(ctx, f, fmt.Sprintf("scale-out %d → %d (join)", from, n), at)
	}
	return nil
}

// rollingRestart restarts every replica, highest ordinal first, after a
// share of the duration, each restart a handover.
func (r *run) rollingRestart(ctx context.Context, f *fleet) error {
	if err := sleep(ctx, r.opts.Duration/(time.Duration(r.opts.Replicas)+1)); err != nil {
		return err
	}
	for i := r.opts.Replicas - 1; i >= 0; i-- {
		s := f.slot(i)
		r.mark("SIGTERM %s", s.id)
		at, err := f.terminate(ctx, s)
		if err != nil {
			return err
		}
		r.mark("start %s", s.id)
		if err := f.restart(ctx, s, 0); err != nil {
			return err
		}
		r.handover(ctx, f, "rolling restart of "+s.id, at)
	}
	return nil
}

// runResyncStorm times two storms that reconcile every object: a spec
// update of each, then a restart of every replica at once.
func runResyncStorm(ctx context.Context, r *run) error {
	f, err := r.startFleet(ctx, ModeSharded, r.opts.Replicas)
	if err != nil {
		return err
	}
	if err := r.createAll(ctx, f); err != nil {
		return err
	}
	r.beginLoad(ctx, f)
	at := time.Now()
	r.mark("touch every object")
	r.setPhase("updating every object at once")
	if err := r.gen.touchAll(ctx); err != nil {
		return err
	}
	r.settle(ctx, f, fmt.Sprintf("spec update of all %d objects at once", r.gen.existing()), at, settleLoad)
	r.scraped(ctx)
	at = time.Now()
	r.mark("SIGTERM every replica, start them again")
	if err := restartAll(ctx, f); err != nil {
		return err
	}
	r.settleFrom(ctx, f, "restart of every replica at once", at, true, settleQuiet)
	r.endLoad(ctx, f)
	return r.endFleet(ctx, f)
}

// restartAll stops every running replica at once, then starts them all
// again.
func restartAll(ctx context.Context, f *fleet) error {
	slots := f.runningSlots()
	var wg sync.WaitGroup
	errs := make([]error, len(slots))
	for i, s := range slots {
		wg.Go(func() { _, errs[i] = f.terminate(ctx, s) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, s := range slots {
		if err := f.restart(ctx, s, 0); err != nil {
			return err
		}
	}
	return nil
}

// createAll creates every object at the create rate and, with a fleet
// running, waits until each is Ready (their create latencies count). Without
// one, the objects wait for the first fleet, and their create latencies are
// not recorded: they would measure the wait.
//
// With a fleet, the creation is the fleet's create storm (CreateStorm): timed
// until every object is Ready, its object writes counted.
func (r *run) createAll(ctx context.Context, f *fleet) error {
	if f == nil {
		r.mark("create %d objects at %g/s", r.opts.Objects, r.opts.CreateRate)
		r.setPhase("creating")
		return r.gen.createRange(ctx, 0, r.opts.Objects, r.opts.CreateRate, false)
	}
	storm, err := r.measureStorm(ctx, stormCreates, r.opts.Objects, r.opts.CreateRate, func(at time.Time) (bool, error) {
		r.mark("create %d objects at %g/s", r.opts.Objects, r.opts.CreateRate)
		r.setPhase("creating")
		if err := r.gen.createRange(ctx, 0, r.opts.Objects, r.opts.CreateRate, true); err != nil {
			return false, err
		}
		ev := r.settle(ctx, f, fmt.Sprintf("creation of %d objects", r.opts.Objects), at, settleLoad)
		if ev.Error != "" {
			return false, fmt.Errorf("%s: %s", ev.Name, ev.Error)
		}
		return true, nil
	})
	f.storm = storm
	return err
}

// recreateAll deletes the objects and creates them again while no fleet
// runs, as fast as the API server takes them, so the next fleet starts on
// new objects; it returns once the load tester's watch saw them all.
func (r *run) recreateAll(ctx context.Context) error {
	r.mark("delete and create %d objects again", r.opts.Objects)
	r.setPhase("recreating the objects")
	if err := r.gen.deleteAll(ctx); err != nil {
		return err
	}
	gone := func(context.Context) (bool, error) { return r.tracker.count() == 0, nil }
	if err := wait.PollUntilContextTimeout(ctx, settlePoll, r.opts.SettleTimeout, true, gone); err != nil {
		return fmt.Errorf("waiting for the deletions to reach the watch: %w", err)
	}
	if err := r.gen.createRange(ctx, 0, r.opts.Objects, recreateRate, false); err != nil {
		return err
	}
	seen := func(context.Context) (bool, error) { return r.tracker.count() == r.opts.Objects, nil }
	if err := wait.PollUntilContextTimeout(ctx, settlePoll, r.opts.SettleTimeout, true, seen); err != nil {
		return fmt.Errorf("waiting for the creations to reach the watch: %w", err)
	}
	return nil
}

// recreateRate is the creates per second of recreateAll: above what this
// machine's API server takes, so it is the limit.
const recreateRate = 2000

// withLoad runs spec updates at the configured rate while actions run, for
// at least d, and marks the fleet's measured phase.
func (r *run) withLoad(ctx context.Context, f *fleet, d time.Duration, actions func(context.Context) error) error {
	perSecond := float64(r.gen.existing()) * r.opts.UpdateRate
	r.beginLoad(ctx, f)
	prof := r.beginProfiles(ctx, f, d)
	r.mark("load: %.1f spec updates/s", perSecond)
	r.setPhase("load on %s, %.1f updates/s for %s", f.label(), perSecond, d)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Until both the duration passed and the actions ended.
		r.gen.updateFor(loadCtx, 1<<62, perSecond)
	}()
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		if r.opts.ValueChangeInterval > 0 && r.propagation != nil {
			r.propagation.run(loadCtx, r.opts.ValueChangeInterval)
		}
	}()
	var err error
	if actions != nil {
		err = actions(ctx)
	}
	if rest := time.Until(f.loadFrom.Add(d)); err == nil && rest > 0 {
		err = sleep(ctx, rest)
	}
	stopLoad()
	<-done
	r.endLoad(ctx, f)
	prof.end(ctx, r, f)
	<-probed
	r.mark("load ends")
	return err
}

// beginLoad starts the fleet's measured phase, once Prometheus scraped the
// quiet before it: its counts start from that scrape.
func (r *run) beginLoad(ctx context.Context, f *fleet) {
	r.scraped(ctx)
	f.loadFrom = time.Now()
}

// endLoad ends the fleet's measured phase, once the load tester's writes
// of the phase have returned.
func (r *run) endLoad(_ context.Context, f *fleet) {
	f.loadTo = time.Now()
}

// endFleet waits for the final settle (every latest generation Ready) and
// stops the fleet.
func (r *run) endFleet(ctx context.Context, f *fleet) error {
	r.settle(ctx, f, "final settle of "+f.label(), time.Now(), settleLoad)
	r.stopFleet(ctx, f)
	return nil
}

// handover records a handover under load.
func (r *run) handover(ctx context.Context, f *fleet, name string, at time.Time) {
	r.settle(ctx, f, name, at, settleHandover)
}

// compare runs the fleets one after another on the same objects and load.
//
// Every fleet starts on the same objects in the same state: new, with no
// label, status or ConfigMap. Before each fleet after the first, the
// objects are deleted and created again, so that each fleet's start is the
// same create storm rather than a check of what the fleet before it did.
func (r *run) compare(ctx context.Context, specs []fleetSpec) error {
	if r.chosen != nil {
		specs = r.chosen
	}
	for i, s := range specs {
		if i > 0 {
			if err := r.recreateAll(ctx); err != nil {
				return err
			}
		} else if err := r.createAll(ctx, nil); err != nil {
			return err
		}
		purpose := ""
		if s.ColdTable {
			if err := r.deleteShardTable(ctx); err != nil {
				return err
			}
			purpose = "cold shard table"
		}
		f, err := r.startFleetFor(ctx, s.Mode, s.Replicas, purpose)
		if err != nil {
			return err
		}
		if err := r.withLoad(ctx, f, r.opts.Duration, nil); err != nil {
			return err
		}
		if err := r.endFleet(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// deleteShardTable deletes the labeler's shard table, so that the next
// fleet starts on a cold one.
func (r *run) deleteShardTable(ctx context.Context) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: replica.DefaultShardTable}}
	r.mark("delete the shard table")
	if err := r.c.Delete(ctx, cm); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the shard table: %w", err)
	}
	return nil
}

// shardTableDomains counts the domains in the labeler's shard table; -1
// when there is none.
func (r *run) shardTableDomains(ctx context.Context) (int, error) {
	var cm corev1.ConfigMap
	err := r.c.Get(ctx, client.ObjectKey{Namespace: LeaseNamespace, Name: replica.DefaultShardTable}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		return -1, nil
	case err != nil:
		return 0, fmt.Errorf("reading the shard table: %w", err)
	}
	return len(cm.Data), nil
}

func runHandover(ctx context.Context, r *run) error {
	if r.opts.Replicas < 2 {
		return fmt.Errorf("handover needs at least 2 replicas, not %d", r.opts.Replicas)
	}
	// The objects exist before the fleet starts: its start is the first
	// (largest) handover, from nobody.
	if err := r.createAll(ctx, nil); err != nil {
		return err
	}
	f, err := r.startFleet(ctx, ModeSharded, r.opts.Replicas)
	if err != nil {
		return err
	}
	r.beginLoad(ctx, f)
	if err := r.handovers(ctx, f); err != nil {
		return err
	}
	r.endLoad(ctx, f)
	return r.endFleet(ctx, f)
}

// handovers runs a sharded fleet of n replicas through the handovers a
// StatefulSet meets, with no load, each settled before the next: a graceful
// scale-down to n-1 (SIGTERM to the highest ordinal after the StatefulSet's
// count drops, so it leaves the ring), the scale-up back to n (a join), a
// crash (SIGKILL to the second replica, not restarted: the survivors take
// its shards when its Leases expire) and its rejoin.
//
// Each event's object writes count from a scrape of the quiet right before
// it: the load tester writes no ConfigBinding or ConfigMap meanwhile (only
// the StatefulSet's count), so they are the replicas' handover cost.
func (r *run) handovers(ctx context.Context, f *fleet) error {
	n := f.size()
	r.scraped(ctx)
	at := time.Now()
	r.mark("scale %d → %d (SIGTERM %s-%d)", n, n-1, StatefulSet, n-1)
	if err := f.scaleTo(ctx, n-1); err != nil {
		return err
	}
	r.settleFrom(ctx, f, fmt.Sprintf("graceful scale-down %d → %d", n, n-1), at, true, settleQuiet)

	r.scraped(ctx)
	at = time.Now()
	r.mark("scale %d → %d", n-1, n)
	if err := f.scaleTo(ctx, n); err != nil {
		return err
	}
	r.settleFrom(ctx, f, fmt.Sprintf("scale-up %d → %d (join)", n-1, n), at, true, settleQuiet)

	s := f.slot(1)
	r.scraped(ctx)
	r.mark("SIGKILL %s", s.id)
	at, err := f.kill(ctx, s)
	if err != nil {
		return err
	}
	r.settleFrom(ctx, f, fmt.Sprintf("crash of %s (SIGKILL, not restarted)", s.id), at, true, settleQuiet)

	r.scraped(ctx)
	at = time.Now()
	r.mark("restart %s", s.id)
	if err := f.restart(ctx, s, 0); err != nil {
		return err
	}
	r.settleFrom(ctx, f, fmt.Sprintf("rejoin of %s after the crash", s.id), at, true, settleQuiet)
	return nil
}

// outage makes the config center answer 503 after OutageAfter, for
// OutageFor, observing what it does, then times the recovery.
func (r *run) outage(ctx context.Context, _ *fleet) error {
	if err := sleep(ctx, r.opts.OutageAfter); err != nil {
		return err
	}
	r.mark("config center outage (503)")
	if err := r.setOutage(ctx, true); err != nil {
		return err
	}
	r.set.pool.Store(1)
	var during outageObservation
	outageEnd := time.Now().Add(r.opts.OutageFor)
	for time.Now().Before(outageEnd) {
		if err := sleep(ctx, min(2*time.Second, time.Until(outageEnd))); err != nil {
			return err
		}
		if err := during.observe(ctx, r); err != nil {
			return err
		}
	}
	for _, x := range during.findings() {
		r.addFinding(x)
	}
	r.mark("config center recovers")
	if err := r.setOutage(ctx, false); err != nil {
		return err
	}
	return r.awaitRecovery(ctx)
}

// awaitRecovery waits until no object says ExternalUnavailable any more.
func (r *run) awaitRecovery(ctx context.Context) error {
	at := time.Now()
	for r.tracker.reasons()["ExternalUnavailable"] != 0 {
		if time.Since(at) > r.opts.SettleTimeout {
			return fmt.Errorf("objects still ExternalUnavailable %s after the recovery", r.opts.SettleTimeout)
		}
		if err := sleep(ctx, settlePoll); err != nil {
			return err
		}
	}
	r.mark("no object ExternalUnavailable")
	r.addFinding(fmt.Sprintf("after the config center recovered, no object said ExternalUnavailable any more after %s", round(time.Since(at))))
	return nil
}

// outageObservation is what the outage did to objects and ConfigMaps.
type outageObservation struct {
	maxUnavailable              int
	samples                     int
	configMaps, emptyConfigMaps int
}

func (o *outageObservation) observe(ctx context.Context, r *run) error {
	reasons := r.tracker.reasons()
	o.maxUnavailable = max(o.maxUnavailable, reasons["ExternalUnavailable"])
	o.samples++
	var cms corev1.ConfigMapList
	if err := r.c.List(ctx, &cms, client.InNamespace(Namespace)); err != nil {
		return fmt.Errorf("listing ConfigMaps during the outage: %w", err)
	}
	empty := 0
	for _, cm := range cms.Items {
		if len(cm.Data) == 0 && cm.Name != "kube-root-ca.crt" {
			empty++
		}
	}
	o.configMaps, o.emptyConfigMaps = len(cms.Items), max(o.emptyConfigMaps, empty)
	return nil
}

func (o *outageObservation) findings() []string {
	if o.samples == 0 {
		return nil
	}
	return []string{
		fmt.Sprintf("during the outage, at most %d objects said ExternalUnavailable at once (sampled %d times)", o.maxUnavailable, o.samples),
		fmt.Sprintf("during the outage, every ConfigMap kept its data: %d of %d ConfigMaps empty at worst", o.emptyConfigMaps, o.configMaps),
	}
}

// addFinding records a scenario's observation.
func (r *run) addFinding(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.report.Findings = append(r.report.Findings, s)
}
