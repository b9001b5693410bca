package sharding

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// intent is what a terminating replica does with its place in the ring.
type intent string

const (
	// intentLeave hands every shard over and leaves the ring: the replica is
	// going away (scale-down, or no StatefulSet to say otherwise).
	intentLeave intent = "leave"
	// intentRestart releases the shards but keeps the member Lease, so the
	// ring does not change and the same replica reclaims its shards when it
	// returns, instead of moving them away and back (a rolling update).
	intentRestart intent = "restart"
)

// intentOf decides from StatefulSet facts: a pod whose ordinal is
// below the desired replica count will be recreated under the same name, so
// it is restarting; one at or above it is being scaled away. A StatefulSet
// being deleted, or an identity that is not "<statefulset>-<ordinal>", leaves.
func intentOf(identity, statefulSet string, desiredReplicas int32, deleting bool) intent {
	if deleting || statefulSet == "" {
		return intentLeave
	}
	if ordinal, ok := ordinalOf(identity, statefulSet); ok && ordinal < desiredReplicas {
		return intentRestart
	}
	return intentLeave
}

// ordinalOf reads the ordinal of a pod of the StatefulSet from its name,
// "<statefulset>-<ordinal>", and says whether identity is one.
func ordinalOf(identity, statefulSet string) (int32, bool) {
	suffix, ok := strings.CutPrefix(identity, statefulSet+"-")
	if !ok {
		return 0, false
	}
	ordinal, err := strconv.ParseInt(suffix, 10, 32)
	if err != nil || ordinal < 0 || strconv.FormatInt(ordinal, 10) != suffix {
		return 0, false
	}
	return int32(ordinal), true
}

// statefulSet reads the configured StatefulSet and its desired replicas
// (1 when unset, as the API defaults it).
func (e *env) statefulSet(ctx context.Context) (*appsv1.StatefulSet, int32, error) {
	var sts appsv1.StatefulSet
	if err := e.apiReader.Get(ctx, client.ObjectKey{Namespace: e.opts.LeaseNamespace, Name: e.opts.StatefulSet}, &sts); err != nil {
		return nil, 0, fmt.Errorf("reading StatefulSet %s: %w", e.opts.StatefulSet, err)
	}
	return &sts, ptr.Deref(sts.Spec.Replicas, 1), nil
}

// terminationIntent reads the StatefulSet. Any doubt (no StatefulSet
// configured, an API error) means leave: handing over costs a move, while a
// wrong restart leaves shards unowned until the member Lease expires.
func (e *env) terminationIntent(ctx context.Context) intent {
	if leave, _ := e.leaving(ctx); leave {
		return intentLeave
	}
	return intentRestart
}

// leaving reads the StatefulSet, as terminationIntent does, and says
// whether this replica leaves the ring and which members stay in it: those
// of the StatefulSet below its desired count, and any member not named as
// one of its pods. Without a StatefulSet every other member stays.
func (e *env) leaving(ctx context.Context) (leave bool, stays func(member string) bool) {
	all := func(string) bool { return true }
	if e.opts.StatefulSet == "" {
		return true, all
	}
	sts, desired, err := e.statefulSet(ctx)
	if err != nil {
		e.log.Error(err, "Deciding between restart and leave; leaving")
		return true, all
	}
	deleting := sts.DeletionTimestamp != nil
	if intentOf(e.opts.Identity, sts.Name, desired, deleting) != intentLeave {
		return false, nil
	}
	return true, func(m string) bool {
		_, pod := strings.CutPrefix(m, sts.Name+"-")
		return !pod || intentOf(m, sts.Name, desired, deleting) == intentRestart
	}
}

// expectedMembers names the StatefulSet's desired replicas
// ("<statefulset>-<ordinal>"), so that replicas starting together build the
// final ring from the start instead of each claiming what the members seen
// so far would give it and handing most of it over moments later. Without a
// StatefulSet, or when it cannot be read, only live members count.
func (e *env) expectedMembers(ctx context.Context) []string {
	if e.opts.StatefulSet == "" || e.opts.StartupGrace < 0 {
		return nil
	}
	sts, desired, err := e.statefulSet(ctx)
	if err != nil {
		e.log.Error(err, "Building the ring from live members only")
		return nil
	}
	out := make([]string, desired)
	for i := range out {
		out[i] = sts.Name + "-" + strconv.Itoa(i)
	}
	e.log.Info("Expecting the StatefulSet's replicas in the ring", "members", len(out), "grace", e.opts.StartupGrace)
	return out
}

// statefulSetWatch keeps the StatefulSet's desired replica count as the API
// server last told it. A scale-down lowers the count before the StatefulSet
// controller signals the pods it removes, and it signals them one by one
// (OrderedReady) or all at once but each reaches Leave at its own moment:
// the replicas still running used to take the shards of the first to leave,
// a new cache and a full scan of the collection each, for shards they would
// hand over again moments later (six watch-lists in five seconds when the
// scale scenario stopped a fleet of four at 100,000 objects). With the
// count watched, every replica computes the ring without the members the
// StatefulSet no longer wants from the moment the count drops: they keep the
// shards they hold until they leave, their successors warm up for those
// shards meanwhile, and they take none.
type statefulSetWatch struct {
	name, namespace string
	client          kubernetes.Interface
	retry           time.Duration
	log             logr.Logger
	wake            func()

	mu sync.Mutex
	// seen says the watch has the StatefulSet; desired is its count then.
	seen    bool
	desired int32
}

// unwanted lists the members that the StatefulSet no longer wants: its pods
// at or above its desired count. None before the watch has seen the
// StatefulSet or after it was deleted: a misnamed StatefulSet must not empty
// the ring, nor one deleted with its pods orphaned and created again.
func (w *statefulSetWatch) unwanted(members []string) []string {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.seen {
		return nil
	}
	var out []string
	for _, m := range members {
		if ordinal, ok := ordinalOf(m, w.name); ok && ordinal >= w.desired {
			out = append(out, m)
		}
	}
	return out
}

// observe notes the StatefulSet's count, or its deletion (sts nil), and
// wakes the coordinator when it changed.
func (w *statefulSetWatch) observe(sts *appsv1.StatefulSet) {
	w.mu.Lock()
	seen, desired := sts != nil, int32(0)
	if seen {
		desired = ptr.Deref(sts.Spec.Replicas, 1)
	}
	changed := seen != w.seen || desired != w.desired
	w.seen, w.desired = seen, desired
	w.mu.Unlock()
	if !changed {
		return
	}
	if seen {
		w.log.Info("The StatefulSet's desired replicas; members at or above the count take no shards", "statefulSet", w.name, "replicas", desired)
	} else {
		w.log.Info("The StatefulSet is gone; every member takes shards", "statefulSet", w.name)
	}
	w.wake()
}

// newStatefulSetWatch prepares the watch of the configured StatefulSet,
// nil without one.
func (e *env) newStatefulSetWatch(wake func()) *statefulSetWatch {
	if e.opts.StatefulSet == "" {
		return nil
	}
	return &statefulSetWatch{name: e.opts.StatefulSet, namespace: e.opts.LeaseNamespace, client: e.leases, retry: e.opts.RetryPeriod,
		log: e.log, wake: wake}
}

// start starts the watch (watch.go). It does not wait for its first list:
// until then (or when the replica may not watch StatefulSets), no member
// counts as unwanted, as before. stop ends the watch and waits for it.
func (w *statefulSetWatch) start(ctx context.Context) (stop func()) {
	if w == nil {
		return func() {}
	}
	lw := toolscache.NewListWatchFromClient(w.client.AppsV1().RESTClient(), "statefulsets", w.namespace,
		fields.OneTermEqualSelector("metadata.name", w.name))
	watchCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	_, done := startWatch(watchCtx, "statefulset", lw, &appsv1.StatefulSet{}, w.retry, func(_, obj any) {
		sts, _ := obj.(*appsv1.StatefulSet)
		w.observe(sts)
	})
	return func() { cancel(); <-done }
}
