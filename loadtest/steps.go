package loadtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
)

// / scaleOut grows the fleet to 2, then 4 replicas, a third of the duration
// apart, each join a handover.
func scaleOut(ctx context.Context, r *run, f *fleet) error {
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
func rollingRestart(ctx context.Context, r *run, f *fleet) error {
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

// resyncStorms times two storms that reconcile every object: a spec
// update of each, then a restart of every replica at once.
func resyncStorms(ctx context.Context, r *run, f *fleet) error {
	r.beginLoad(ctx, f)
	at := time.Now()
	r.mark("touch every object")
	r.setPhase("updating every object at once")
	if err := r.gen.touchAll(ctx); err != nil {
		return err
	}
	r.settle(ctx, f, fmt.Sprintf("spec update of all %d objects at once", r.gen.existing()), at, settleLoad)
	at = r.spanStart(ctx)
	r.mark("SIGTERM every replica, start them again")
	if err := restartAll(ctx, f); err != nil {
		return err
	}
	r.settleFrom(ctx, f, "restart of every replica at once", at, true, settleQuiet)
	r.endLoad(ctx, f)
	return nil
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
	granted := make(chan struct{})
	go func() {
		defer close(granted)
		if r.authz != nil && f.mode.authorized() {
			r.authz.probe(loadCtx, r.restConfig, r.obs, r.log)
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
	// A grant change still awaited belongs to the phase, shown or not.
	<-granted
	r.endLoad(ctx, f)
	prof.end(ctx, r, f)
	<-probed
	r.mark("load ends")
	return err
}

// beginLoad starts the fleet's measured phase, once Prometheus scraped the
// quiet before it: its counts start from that scrape.
func (r *run) beginLoad(ctx context.Context, f *fleet) {
	f.loadFrom = r.spanStart(ctx)
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

// compareFleets runs the fleets one after another on the same objects and load.
//
// Every fleet starts on the same objects in the same state: new, with no
// label, status or ConfigMap. Before each fleet after the first, the
// objects are deleted and created again, so that each fleet's start is the
// same create storm rather than a check of what the fleet before it did.
func compareFleets(ctx context.Context, r *run, specs []fleetSpec) error {
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
			r.mark("delete the shard table")
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

// quietHandovers runs a sharded fleet of n replicas through the handovers a
// StatefulSet meets, with no load, each settled before the next: a graceful
// scale-down to n-1 (SIGTERM to the highest ordinal after the StatefulSet's
// count drops, so it leaves the ring), the scale-up back to n (a join), a
// crash (SIGKILL to the second replica, not restarted: the survivors take
// its shards when its Leases expire) and its rejoin.
//
// Each event's object writes count from a scrape of the quiet right before
// it: the load tester writes no ConfigBinding or ConfigMap meanwhile (only
// the StatefulSet's count), so they are the replicas' handover cost.
func quietHandovers(ctx context.Context, r *run, f *fleet) error {
	n := f.size()
	at := r.spanStart(ctx)
	r.mark("scale %d → %d (SIGTERM %s-%d)", n, n-1, StatefulSet, n-1)
	if err := f.scaleTo(ctx, n-1); err != nil {
		return err
	}
	r.settleFrom(ctx, f, fmt.Sprintf("graceful scale-down %d → %d", n, n-1), at, true, settleQuiet)

	at = r.spanStart(ctx)
	r.mark("scale %d → %d", n-1, n)
	if err := f.scaleTo(ctx, n); err != nil {
		return err
	}
	r.settleFrom(ctx, f, fmt.Sprintf("scale-up %d → %d (join)", n-1, n), at, true, settleQuiet)

	s := f.slot(1)
	r.spanStart(ctx)
	r.mark("SIGKILL %s", s.id)
	at, err := f.kill(ctx, s)
	if err != nil {
		return err
	}
	r.settleFrom(ctx, f, fmt.Sprintf("crash of %s (SIGKILL, not restarted)", s.id), at, true, settleQuiet)

	at = r.spanStart(ctx)
	r.mark("restart %s", s.id)
	if err := f.restart(ctx, s, 0); err != nil {
		return err
	}
	r.settleFrom(ctx, f, fmt.Sprintf("rejoin of %s after the crash", s.id), at, true, settleQuiet)
	return nil
}

// outageUnderLoad takes the config center away after OutageAfter, for
// OutageFor, observing what it does, then times the recovery.
func outageUnderLoad(ctx context.Context, r *run, _ *fleet) error {
	if err := sleep(ctx, r.opts.OutageAfter); err != nil {
		return err
	}
	last, held, err := changeBeforeOutage(ctx, r)
	if err != nil {
		return err
	}
	defer r.gen.release(held)
	r.mark("config center outage: it %s", r.center.outage())
	if err := r.center.setOutage(ctx, true); err != nil {
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
		r.report.addFinding(x)
	}
	r.mark("config center recovers")
	if err := r.center.setOutage(ctx, false); err != nil {
		return err
	}
	if err := awaitRecovery(ctx, r); err != nil {
		return err
	}
	checkChangeBeforeOutage(ctx, r, last)
	return nil
}

// changeBeforeOutage puts a new value into a key that a live binding
// reads, the moment before the config center goes away: a change the
// replicas may have had no time to fetch, which must not be lost. The
// spec updates leave that binding alone until the caller releases it
// (held), so that it still reads the key when the check looks: with its
// keys switched by an update, the check had no binding to decide on.
func changeBeforeOutage(ctx context.Context, r *run) (pr *probe, held int, err error) {
	r.gen.mu.Lock()
	live := slices.Clone(r.gen.live)
	r.gen.mu.Unlock()
	if len(live) == 0 {
		return nil, 0, errors.New("no object exists to change a value of before the outage")
	}
	i := live[0]
	r.gen.hold(i)
	pr = &probe{domain: configcenter.SeedDomain(r.set.domains[i]), key: string(r.set.keys(i, r.set.updates[i].Load())[0]),
		value: fmt.Sprintf("before-outage-%d", time.Now().UnixNano())}
	if err := r.center.put(ctx, pr.domain, pr.key, pr.value); err != nil {
		r.gen.release(i)
		return nil, 0, fmt.Errorf("changing %s/%s before the outage: %w", pr.domain, pr.key, err)
	}
	pr.at = time.Now()
	return pr, i, nil
}

// checkChangeBeforeOutage waits, at most the settle timeout after the
// recovery, until the ConfigMap of every binding whose spec (as the API
// server has it) still reads the key changed before the outage holds its
// value, and reports the check; with no such binding left it has nothing
// to decide on, and fails.
func checkChangeBeforeOutage(ctx context.Context, r *run, pr *probe) {
	const name = "no change made just before the outage lost"
	deadline := time.Now().Add(r.opts.SettleTimeout)
	for {
		var cbs configv1alpha1.ConfigBindingList
		if err := r.c.List(ctx, &cbs, client.InNamespace(Namespace)); err != nil {
			r.report.addCheck(noDataCheck(name, fmt.Sprintf("listing the ConfigBindings: %v", err)))
			return
		}
		binding, stale := 0, 0
		for _, cb := range cbs.Items {
			if cb.Spec.Domain != pr.domain || !slices.Contains(cb.Spec.Keys, configv1alpha1.ConfigKey(pr.key)) {
				continue
			}
			binding++
			var cm corev1.ConfigMap
			if err := r.c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: cb.Spec.Target.ConfigMapName}, &cm); err != nil || cm.Data[pr.key] != pr.value {
				stale++
			}
		}
		switch {
		case binding == 0:
			r.report.addCheck(noDataCheck(name, fmt.Sprintf("no binding reads %s/%s any more, the key changed before the outage", pr.domain, pr.key)))
			return
		case stale == 0:
			r.report.addCheck(Check{Name: name, Passed: true, Detail: fmt.Sprintf("%s/%s changed just before the outage: the ConfigMaps of all %d bindings reading it hold the new value, %s after it was put",
				pr.domain, pr.key, binding, round(time.Since(pr.at)))})
			return
		case time.Now().After(deadline) || sleep(ctx, settlePoll) != nil:
			r.report.addCheck(Check{Name: name, Passed: false, Detail: fmt.Sprintf("%s/%s changed just before the outage: %d of the %d bindings reading it have a ConfigMap without the new value %s after the recovery",
				pr.domain, pr.key, stale, binding, r.opts.SettleTimeout)})
			return
		}
	}
}

// awaitRecovery waits until no object says ExternalUnavailable any more.
func awaitRecovery(ctx context.Context, r *run) error {
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
	r.report.addFinding(fmt.Sprintf("after the config center recovered, no object said ExternalUnavailable any more after %s", round(time.Since(at))))
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
