package sharding

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kshard/kshard/sharding/lease"
)

// Replica is one member of a ring: it keeps its member Lease, computes the
// ring from the live members, claims the shards the ring gives it, runs the
// informer caches of its held shards (one per batch of shards acquired
// together) and feeds their objects to the controller, and hands shards over
// when the ring changes or the process stops.
//
// A Replica is a manager.Runnable that runs on every replica (it does not
// need leader election), and the controller's event source. It is a front:
// the member Lease (membership.go), the coordinator and the shards it runs
// (coordinator.go, shard.go, group.go) and the labeler (labeler.go) each
// keep their own state.
type Replica struct {
	env     *env
	member  *memberLease
	coord   *coordinator
	labeler *labeler
	// controller is the one controller this replica feeds.
	controller feeds
}

// env is what every part of a replica reads: its options, names, clients,
// metrics and log, set once by New, and the controller's queue, set once
// when the controller starts.
type env struct {
	opts Options
	// holder is this process's name in the Leases it holds:
	// "<identity>_<incarnation>".
	holder string
	// keys are the ring's label and annotation keys (Options.LabelPrefix).
	keys      labelKeys
	metrics   ringMetrics
	log       logr.Logger
	mgr       manager.Manager
	leases    kubernetes.Interface
	apiReader client.Reader
	writer    client.Client
	forGVK    schema.GroupVersionKind
	// observed times the expiry of every ring Lease this replica reads or
	// writes, on its own monotonic clock.
	observed observations
	queue    queueSlot
}

// queueSlot is the sharded controller's work queue, which exists only once
// the controller has started: shard caches wait for it before they deliver
// events.
type queueSlot struct {
	once  sync.Once
	ready chan struct{}
	q     workqueue.TypedRateLimitingInterface[Request]
}

// set is called once, by the controller's source.
func (s *queueSlot) set(q workqueue.TypedRateLimitingInterface[Request]) {
	s.once.Do(func() {
		s.q = q
		close(s.ready)
	})
}

// New creates a Replica and adds it to the manager.
func New(mgr manager.Manager, opts Options) (*Replica, error) {
	if err := opts.setDefaults(mgr.GetLogger().WithName("sharding")); err != nil {
		return nil, err
	}
	forGVK, err := apiutil.GVKForObject(opts.For.Object, mgr.GetScheme())
	if err != nil {
		return nil, fmt.Errorf("finding the kind of the primary object: %w", err)
	}
	// Lease writes must never wait behind the replica's own informer and
	// reconcile traffic in a client-side rate limiter: a throttled renewal
	// fences shards for nothing. The API server's priority and fairness
	// still protects it.
	leaseConfig := rest.CopyConfig(mgr.GetConfig())
	leaseConfig.QPS, leaseConfig.Burst, leaseConfig.RateLimiter = -1, 0, nil
	cs, err := kubernetes.NewForConfigAndClient(leaseConfig, mgr.GetHTTPClient())
	if err != nil {
		return nil, fmt.Errorf("creating Lease client: %w", err)
	}
	keys := newLabelKeys(opts.LabelPrefix)
	holder := lease.Holder(opts.Identity, opts.Incarnation)
	e := &env{
		opts:      opts,
		keys:      keys,
		holder:    holder,
		metrics:   newRingMetrics(opts.MetricsPrefix, opts.Ring),
		log:       opts.Logger.WithValues("ring", opts.Ring, "replica", opts.Identity, "holder", holder),
		mgr:       mgr,
		leases:    cs,
		apiReader: mgr.GetAPIReader(),
		writer:    mgr.GetClient(),
		forGVK:    forGVK,
		queue:     queueSlot{ready: make(chan struct{})},
	}
	coord := newCoordinator(e)
	coord.sts = e.newStatefulSetWatch(coord.wake)
	r := &Replica{env: e, coord: coord}
	r.member = newMemberLease(e, coord.wake)
	r.labeler = newLabeler(e, r.inRing)
	coord.member, coord.labeler = r.member, r.labeler
	if err := mgr.Add(r); err != nil {
		return nil, err
	}
	if err := mgr.Add(r.labeler); err != nil {
		return nil, err
	}
	return r, nil
}

// namespaces is the cache restriction of Options.Namespaces.
func (e *env) namespaces() map[string]cache.Config {
	if len(e.opts.Namespaces) == 0 {
		return nil
	}
	out := map[string]cache.Config{}
	for _, ns := range e.opts.Namespaces {
		out[ns] = cache.Config{}
	}
	return out
}

// Identity is this replica's name in the ring.
func (r *Replica) Identity() string { return r.env.opts.Identity }

// OwnedLabels are the labels of an object created for shard's objects,
// under the ring's label prefix.
func (r *Replica) OwnedLabels(shard int32, domain string) map[string]string {
	return r.env.keys.owned(shard, domain)
}

// Count is the ring's shard count.
func (r *Replica) Count() int32 { return r.env.opts.Shards }

// NeedLeaderElection is false: every replica runs its shards.
func (r *Replica) NeedLeaderElection() bool { return false }

// Start runs the replica until ctx is done, then hands its shards over
// (or, when restarting in a StatefulSet, releases them but keeps its place)
// before it returns.
func (r *Replica) Start(ctx context.Context) error {
	e := r.env
	e.log.Info("Starting replica", "shards", e.opts.Shards, "leaseNamespace", e.opts.LeaseNamespace)
	stopWatching, err := r.coord.watchLeases(ctx)
	if err != nil {
		return err
	}
	defer stopWatching()
	defer r.coord.sts.start(ctx)()

	r.coord.expect(e.expectedMembers(ctx))
	memberDone := make(chan struct{})
	memberCtx, stopMember := context.WithCancel(ctx)
	go func() { defer close(memberDone); r.member.run(memberCtx) }()

	r.coord.run(ctx)

	// Shutdown: decide whether we leave the ring or only restart, then drain.
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.DrainTimeout+e.opts.RenewDeadline)
	defer cancel()
	intent := e.terminationIntent(shutdownCtx)
	e.log.Info("Stopping replica", "intent", intent)
	stopMember()
	<-memberDone
	if intent == intentLeave {
		// Leaving first lets the others compute the new ring at once, so they
		// are ready to acquire each shard the moment it is released.
		r.member.delete(shutdownCtx)
	} else {
		r.member.handOver(shutdownCtx)
	}
	reason := "shutdown"
	if intent == intentRestart {
		reason = "restart"
	}
	r.coord.releaseAll(reason)
	return nil
}

// Leave hands this replica's shards over warm when it leaves the ring (a
// scale-down; not a restart in its StatefulSet, which keeps its shards): it
// says so on its member Lease and keeps running its shards until every
// replica that takes some of them has synced a cache of them, or for
// Options.WarmLeave at most. Call it when the termination signal comes and
// before the manager stops: a manager stops its controllers' workers first,
// and the shards would go unrun meanwhile. Start, when its context ends,
// then hands the shards over as it always does, and each new owner runs its
// shards as soon as it holds them instead of after a sync of its own (9–13 s
// at 100,000 objects). A replica stopped without Leave hands them over cold.
func (r *Replica) Leave(ctx context.Context) {
	e := r.env
	if e.opts.WarmLeave < 0 || !r.member.held() {
		return
	}
	leave, stays := e.leaving(ctx)
	if !leave {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.WarmLeave)
	defer cancel()
	if n, err := r.coord.staying(ctx, stays); err != nil || n == 0 {
		// Nobody to hand over to warm (the whole ring stops), or the ring
		// cannot be read: leave cold.
		return
	}
	started := time.Now()
	r.member.say(e.keys.Leaving, "true")
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		cold, err := r.coord.coldSuccessors(ctx)
		if err == nil && len(cold) == 0 {
			e.log.Info("Leaving: the replicas taking this one's shards synced caches of them", "took", time.Since(started))
			return
		}
		select {
		case <-ctx.Done():
			e.log.Info("Leaving with replicas taking this one's shards not synced yet; they start those cold",
				"waited", time.Since(started), "notSynced", cold, "error", err)
			return
		case <-tick.C:
		}
	}
}

// Holds reports whether this replica holds a shard now: it runs it, and
// renewed its Lease within the renew deadline. A shard can be lost at any
// time; a write asks WriteContext instead.
func (r *Replica) Holds(n int32) bool {
	s := r.coord.shard(n)
	if s == nil {
		return false
	}
	_, ok := s.holdUntil(time.Now())
	return ok
}

// WriteContext answers "may I write?" for one write of shard n's objects,
// and must be asked before each: ok is false unless this replica holds the
// shard now (running or draining, its Lease renewed within the renew
// deadline on this process's monotonic clock). The returned context ends
// with the hold, so a write that a pause (GC, CPU throttling, SIGSTOP, a
// frozen VM) delays past it is cancelled rather than sent; a write already
// sent reaches the API server LeaseDuration − RenewDeadline before anyone
// else may take the shard. Call cancel when the write returned.
//
// A reconciler that is refused returns without an error: when the shard is
// still held (its hold only lapsed for a moment), the sharded controller
// retries the request within a quarter of the retry period; when it is not,
// the request is dropped and the shard's next holder lists the object.
func (r *Replica) WriteContext(ctx context.Context, n int32) (context.Context, context.CancelFunc, bool) {
	s := r.coord.shard(n)
	if s == nil {
		return ctx, func() {}, false
	}
	until, ok := s.holdUntil(time.Now())
	if !ok {
		noteRefusal(ctx)
		return ctx, func() {}, false
	}
	wctx, cancel := context.WithDeadline(ctx, until)
	return wctx, cancel, true
}

// Reader reads a held shard's objects from its informer cache.
func (r *Replica) Reader(n int32) (client.Reader, bool) {
	s := r.coord.shard(n)
	if s == nil {
		return nil, false
	}
	return s.currentReader()
}

// WaitForSync waits until shard n's informers have synced here, and
// reports false when the shard stopped (or ctx ended) first. An OnAcquire
// hook that reads the shard's objects waits for it in a goroutine.
func (r *Replica) WaitForSync(ctx context.Context, n int32) bool {
	s := r.coord.shard(n)
	if s == nil {
		return false
	}
	return s.waitForSync(ctx)
}

// HeldShards lists the shards this replica runs, sorted.
func (r *Replica) HeldShards() []int32 { return r.coord.heldShards() }

// inRing reports why this replica may not act for the ring (claim shards,
// label objects): another process runs its identity, its shard count
// differs from the ring's, or its ring does not have it yet.
func (r *Replica) inRing() error {
	if err := r.member.notHeldReason(); err != nil {
		return err
	}
	return r.coord.inRing()
}

// Ready is a readiness check: ready once this replica runs every shard the
// ring gives it, with synced informers, and its shard count agrees. A
// replica that leaves the ring is given no shard: it is ready, so that a
// scale-down (an OrderedReady StatefulSet waits on its pods' readiness)
// does not see it fail.
func (r *Replica) Ready() error {
	if err := r.inRing(); err != nil && !errors.Is(err, errLeaving) {
		return err
	}
	if missing := r.coord.missing(); len(missing) > 0 {
		return fmt.Errorf("%d desired shards not running yet: %v", len(missing), missing)
	}
	return nil
}
