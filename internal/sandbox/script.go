package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/ring"
)

// pollInterval is how often the script reads the ring while it waits. It is
// the resolution of the handover times it reports.
const pollInterval = 200 * time.Millisecond

// objectPollInterval is how often the script lists every ConfigBinding while
// it waits for them: as often as the ring for the default 120 objects,
// less often for many, so the sandbox does not load the API server it is
// measuring.
func (sc *script) objectPollInterval() time.Duration {
	return pollInterval * time.Duration(max(1, sc.s.opts.Objects/500))
}

// script is the guided tour: wait until everything is ready, then move shards
// the three ways they move in production (a replica leaves, one joins, one
// crashes) and measure each from the signal to the moment every shard is held
// again by its desired owner, and to the moment every new holder runs its
// shards (its /readyz) with every object Ready. It judges by what an operator
// sees: Leases, readiness and object status.
type script struct {
	s       *sandbox
	c       client.Client
	scraper *scraper
	center  *configetcd.Server
	authz   *authorization
	results []handover
	// shown is the last shard map printed, so an unchanged one is not
	// printed twice in a row.
	shown string
}

// handover is one measured move of shards.
type handover struct {
	event   string // "graceful leave of kshard-2"
	shards  time.Duration
	objects time.Duration
}

func (sc *script) run(ctx context.Context) error {
	out := sc.s.out
	out.printf("\nwaiting until every replica is ready and every ConfigBinding is Ready ...")
	start := time.Now()
	took, err := sc.waitFor(ctx, "every replica ready and every ConfigBinding Ready", start, sc.objectPollInterval(), func(ctx context.Context) (bool, string, error) {
		for _, r := range sc.s.replicas.all() {
			if !sc.scraper.ready(ctx, r.healthAddr) {
				return false, r.id + " is not ready (/readyz)", nil
			}
		}
		return sc.settled(ctx)
	})
	if err != nil {
		return err
	}
	st, err := readRing(ctx, sc.c)
	if err != nil {
		return err
	}
	out.printf("all %d replicas ready and all %d ConfigBindings Ready after %s", len(sc.s.replicas.all()), sc.s.opts.Objects, round(took))
	sc.shown = shardMap(st)
	out.printf("%s", sc.shown)

	if err := sc.change(ctx); err != nil {
		return err
	}
	if err := sc.revoke(ctx); err != nil {
		return err
	}

	n := len(sc.s.replicas.all())
	if n < 2 {
		out.printf("one replica: no handover to show (run with --replicas 2 or more)")
		return nil
	}
	leaver := sc.s.replicas.get(fmt.Sprintf("kshard-%d", n-1))
	crasher := sc.s.replicas.get(fmt.Sprintf("kshard-%d", n-2))
	steps := []func(context.Context) error{
		func(ctx context.Context) error { return sc.leave(ctx, leaver) },
		func(ctx context.Context) error { return sc.join(ctx, leaver) },
		func(ctx context.Context) error { return sc.crash(ctx, crasher) },
		func(ctx context.Context) error { return sc.join(ctx, crasher) },
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	sc.summary()
	return nil
}

// change is what the config center is for: a value changed in etcd (as a
// person would with etcdctl) reaches every ConfigMap that binds it through
// the replicas' watch, with no object written by anyone but kshard.
func (sc *script) change(ctx context.Context) error {
	domain, key := configcenter.SeedDomain(0), configcenter.SeedKey(0)
	var targets []string
	for _, cb := range sampleBindings(sc.s.opts) {
		if cb.Spec.Domain == domain && slices.Contains(cb.Spec.Keys, configv1alpha1.ConfigKey(key)) {
			targets = append(targets, cb.Spec.Target.ConfigMapName)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	value := "changed-" + time.Now().UTC().Format("150405")
	etcdKey := etcdsource.DefaultPrefix + "/" + domain + "/" + key
	sc.s.out.printf("\n== a value changed in the config center: %s ==", sc.s.etcdctl(sc.center, "put", etcdKey, value))
	ec, err := sc.center.Client()
	if err != nil {
		return err
	}
	defer ec.Close()
	t0 := time.Now()
	if _, err := ec.Put(ctx, etcdKey, value); err != nil {
		return fmt.Errorf("changing %s in the config center: %w", etcdKey, err)
	}
	took, err := sc.waitFor(ctx, fmt.Sprintf("%s in the %d ConfigMaps that bind it", etcdKey, len(targets)), t0, pollInterval,
		func(ctx context.Context) (bool, string, error) {
			for _, name := range targets {
				var cm corev1.ConfigMap
				if err := sc.c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, &cm); err != nil {
					return false, "", err
				}
				if got := cm.Data[key]; got != value {
					return false, fmt.Sprintf("ConfigMap %s has %s=%q", name, key, got), nil
				}
			}
			return true, "", nil
		})
	if err != nil {
		return err
	}
	sc.s.out.printf("the new value of %s in all %d ConfigMaps that bind it after %s (the replicas watch etcd)",
		etcdKey, len(targets), round(took))
	return nil
}

// revoke shows the authorization system deciding: the binding of
// namespace Ungranted says Forbidden; then a domain's grant to the team is
// revoked live, and its bindings' ConfigMaps lose their values, until the
// grant is given back.
func (sc *script) revoke(ctx context.Context) error {
	out := sc.s.out
	var copied configv1alpha1.ConfigBinding
	if err := sc.c.Get(ctx, client.ObjectKeyFromObject(ungrantedBinding()), &copied); err != nil {
		return err
	}
	if c := meta.FindStatusCondition(copied.Status.Conditions, conditionReady); c != nil {
		out.printf("\n%s/%s, a binding of %s in a namespace SpiceDB grants nothing: %s: %s", Ungranted, copied.Name, copied.Spec.Domain, c.Reason, c.Message)
	}
	domain := configcenter.SeedDomain(1 % sc.s.opts.Domains)
	var targets []string
	for _, cb := range sampleBindings(sc.s.opts) {
		if cb.Spec.Domain == domain {
			targets = append(targets, cb.Name)
		}
	}
	grant := teamReads(domain)
	out.printf("\n== a grant revoked live: SpiceDB deletes %s ==", grant)
	t0 := time.Now()
	if err := sc.authz.grants.Delete(ctx, grant); err != nil {
		return err
	}
	took, err := sc.waitFor(ctx, fmt.Sprintf("the %d bindings of %s Forbidden, their ConfigMaps empty", len(targets), domain), t0, pollInterval,
		sc.bindingsAre(targets, func(cb *configv1alpha1.ConfigBinding, cm *corev1.ConfigMap) bool {
			return forbidden(cb) && len(cm.Data) == 0
		}))
	if err != nil {
		return err
	}
	out.printf("all %d bindings of %s say Forbidden and their ConfigMaps hold none of its values after %s", len(targets), domain, round(took))
	t0 = time.Now()
	if err := sc.authz.grants.Touch(ctx, grant); err != nil {
		return err
	}
	took, err = sc.waitFor(ctx, fmt.Sprintf("the %d bindings of %s Ready again", len(targets), domain), t0, pollInterval,
		sc.bindingsAre(targets, func(cb *configv1alpha1.ConfigBinding, cm *corev1.ConfigMap) bool {
			return isReady(cb) && len(cm.Data) > 0
		}))
	if err != nil {
		return err
	}
	out.printf("the grant given back: all %d Ready with their values again after %s (no restart)", len(targets), round(took))
	return nil
}

// bindingsAre is a wait condition: every named binding of Namespace, with
// its ConfigMap, passes ok.
func (sc *script) bindingsAre(names []string, ok func(*configv1alpha1.ConfigBinding, *corev1.ConfigMap) bool) func(context.Context) (bool, string, error) {
	return func(ctx context.Context) (bool, string, error) {
		for _, name := range names {
			var cb configv1alpha1.ConfigBinding
			if err := sc.c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: name}, &cb); err != nil {
				return false, "", err
			}
			var cm corev1.ConfigMap
			if err := sc.c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: cb.Spec.Target.ConfigMapName}, &cm); err != nil {
				return false, "", err
			}
			if !ok(&cb, &cm) {
				return false, fmt.Sprintf("%s: %v, %d values", name, cb.Status.Conditions, len(cm.Data)), nil
			}
		}
		return true, "", nil
	}
}

// leave is a scale-down: SIGTERM makes the replica leave the ring, drain
// each shard and release its Lease, so the new owners acquire at once.
func (sc *script) leave(ctx context.Context, r *replica) error {
	event := "graceful leave of " + r.id
	sc.s.out.printf("\n== %s: SIGTERM (a scale-down: it leaves the ring and hands each shard over) ==", event)
	return sc.measure(ctx, event, func() error {
		sc.s.replicas.terminate(r)
		return nil
	}, gone(r.id), func(t0 time.Time) {
		ended, err := r.wait()
		sc.s.out.printf("%s: the process ended %s after SIGTERM (%s)", event, round(ended.Sub(t0)), childproc.ExitText(err))
	})
}

// join is a scale-up (or a return): the replica becomes a member, the ring
// gives it a share of the shards, their holders drain and release them.
func (sc *script) join(ctx context.Context, r *replica) error {
	event := "join of " + r.id
	sc.s.out.printf("\n== %s: starting it again (it joins the ring and takes its share of the shards) ==", event)
	return sc.measure(ctx, event, func() error {
		if err := sc.s.replicas.start(r); err != nil {
			return err
		}
		sc.s.out.printf("%s: started (pid %d)", event, r.pid())
		return nil
	}, func(st *ring.Status) (bool, string) {
		if !liveMember(st, r.id) {
			return false, r.id + " is not a live ring member yet"
		}
		return balanced(st)
	}, nil)
}

// crash is a node failure: SIGKILL leaves no time to hand anything over, so
// the replica's Leases must expire (one lease duration) before anyone else
// may take its shards. Until then nobody reconciles their objects.
func (sc *script) crash(ctx context.Context, r *replica) error {
	event := "crash of " + r.id
	sc.s.out.printf("\n== %s: SIGKILL (no handover: its Leases expire after %s, then the others take its shards) ==", event, leaseDuration)
	return sc.measure(ctx, event, func() error { return sc.s.replicas.kill(r) }, gone(r.id), nil)
}

// gone is the end of a leave or a crash: the replica is not a live member,
// holds nothing, and every shard is held by its desired owner.
func gone(id string) func(*ring.Status) (bool, string) {
	return func(st *ring.Status) (bool, string) {
		if liveMember(st, id) {
			return false, id + " is still a live ring member"
		}
		for _, s := range st.Shards {
			if s.Holder == id {
				return false, fmt.Sprintf("%s still holds shard %d", id, s.Shard)
			}
		}
		return balanced(st)
	}
}

// measure runs one handover: it prints the shard map, acts, waits until the
// ring is done (and runs after, if any, at that point), waits until every new
// holder runs its shards and every object is Ready, and prints both times, the
// new shard map, what moved, and whether any object's shard label changed
// (none should: only Leases move).
func (sc *script) measure(ctx context.Context, event string, act func() error,
	done func(*ring.Status) (bool, string), after func(t0 time.Time)) error {
	out := sc.s.out
	before, err := readRing(ctx, sc.c)
	if err != nil {
		return err
	}
	bindings, err := listBindings(ctx, sc.c)
	if err != nil {
		return err
	}
	labelsBefore := shardLabels(bindings)
	if m := shardMap(before); m != sc.shown {
		out.printf("before:\n%s", m)
	} else {
		out.printf("before: the shard map above")
	}

	t0 := time.Now()
	if err := act(); err != nil {
		return fmt.Errorf("%s: %w", event, err)
	}
	shardsTook, err := sc.waitFor(ctx, event+": every shard held by its desired owner", t0, pollInterval, func(ctx context.Context) (bool, string, error) {
		st, err := readRing(ctx, sc.c)
		if err != nil {
			return false, "", err
		}
		ok, detail := done(st)
		return ok, detail, nil
	})
	if err != nil {
		return err
	}
	out.printf("%s: every shard held by its desired owner after %s", event, round(shardsTook))
	if after != nil {
		after(t0)
	}
	objectsTook, err := sc.waitFor(ctx, event+": every new holder running its shards and every ConfigBinding Ready", t0,
		sc.objectPollInterval(), sc.settled)
	if err != nil {
		return err
	}
	out.printf("%s: every new holder running its shards and every ConfigBinding Ready after %s", event, round(objectsTook))

	st, err := readRing(ctx, sc.c)
	if err != nil {
		return err
	}
	bindings, err = listBindings(ctx, sc.c)
	if err != nil {
		return err
	}
	sc.shown = shardMap(st)
	out.printf("after:\n%s\n%s\n  %s", sc.shown, moves(before, st), relabeled(labelsBefore, shardLabels(bindings)))
	sc.results = append(sc.results, handover{event: event, shards: shardsTook, objects: objectsTook})
	return nil
}

// settled is a wait condition: every shard held by its desired owner, every
// running replica ready (it runs every shard the ring gives it, informers
// synced), and every ConfigBinding Ready.
func (sc *script) settled(ctx context.Context) (bool, string, error) {
	st, err := readRing(ctx, sc.c)
	if err != nil {
		return false, "", err
	}
	bindings, err := listBindings(ctx, sc.c)
	if err != nil {
		return false, "", err
	}
	if len(bindings) < sc.s.opts.Objects {
		return false, fmt.Sprintf("%d of %d ConfigBindings exist", len(bindings), sc.s.opts.Objects), nil
	}
	if ok, detail := balanced(st); !ok {
		return false, detail, nil
	}
	for _, r := range sc.s.replicas.running() {
		if !sc.scraper.ready(ctx, r.healthAddr) {
			return false, r.id + " does not run all its shards yet (/readyz)", nil
		}
	}
	ok, detail := settled(bindings)
	return ok, detail, nil
}

// waitFor polls check every poll until it holds, and returns how long after
// from that was observed. It gives up after StepTimeout, saying what was still missing,
// or when ctx ends (Ctrl-C, or a replica died), saying why. Errors from
// check (the API server being slow) are retried: only the bound fails a step.
func (sc *script) waitFor(ctx context.Context, what string, from time.Time, poll time.Duration,
	check func(context.Context) (bool, string, error)) (time.Duration, error) {
	timeout := sc.s.opts.StepTimeout
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	detail := "not checked yet"
	for {
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ok, d, err := check(callCtx)
		cancel()
		switch {
		case ctx.Err() != nil:
		case err != nil:
			detail = err.Error()
		case ok:
			// Observed at the end of the check: an upper bound.
			return time.Since(from), nil
		default:
			detail = d
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case <-deadline.C:
			return 0, fmt.Errorf("waiting for %s: not done after %s: %s", what, timeout, detail)
		case <-tick.C:
		}
	}
}

func (sc *script) summary() {
	var b strings.Builder
	fmt.Fprintf(&b, "\nhandover summary (lease %s, renew deadline %s, retry period %s; from the signal; shards polled every %s, objects every %s):\n",
		leaseDuration, renewDeadline, retryPeriod, pollInterval, sc.objectPollInterval())
	tw := tabwriter.NewWriter(&b, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "  EVENT\tEVERY SHARD HELD BY ITS DESIRED OWNER\tEVERY NEW HOLDER RUNNING ITS SHARDS")
	for _, h := range sc.results {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", h.event, round(h.shards), round(h.objects))
	}
	_ = tw.Flush()
	sc.s.out.printf("%s", strings.TrimRight(b.String(), "\n"))
}

// shardLabels are the objects' shard labels by namespace/name.
func shardLabels(bindings []configv1alpha1.ConfigBinding) map[string]string {
	out := make(map[string]string, len(bindings))
	for _, cb := range bindings {
		out[cb.Namespace+"/"+cb.Name] = cb.Labels[sharding.LabelShard]
	}
	return out
}

// relabeled checks kshard's promise that handovers move Leases, never labels.
func relabeled(before, after map[string]string) string {
	var changed []string
	for k, v := range before {
		if w, ok := after[k]; ok && w != v {
			changed = append(changed, fmt.Sprintf("%s: %s -> %s", k, v, w))
		}
	}
	if len(changed) == 0 {
		return fmt.Sprintf("no object changed its shard label (%d checked)", len(before))
	}
	return fmt.Sprintf("WARNING: %d objects changed their shard label, e.g. %s", len(changed), changed[0])
}
