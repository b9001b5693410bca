package sharding

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

type shardState int

const (
	stateAcquiring shardState = iota
	stateActive
	stateDraining
	stateStopped
)

// shard is the runtime of one shard on this replica: its Lease, its cache,
// and the count of its in-flight reconciles. One goroutine (run) owns the
// Lease from acquisition to release, so renewals, fencing and release never
// race each other.
type shard struct {
	r    *Replica
	id   int32
	name string
	log  logr.Logger

	done      chan struct{} // closed when run returns
	releaseCh chan string   // the release reason; buffered, sent once
	releasing chan struct{} // closed with the release request
	relOnce   sync.Once

	lock      *resourcelock.LeaseLock
	record    resourcelock.LeaderElectionRecord
	lastRenew time.Time // local time taken before the last successful write

	mu       sync.Mutex
	state    shardState
	isSynced bool
	inflight int
	idle     chan struct{} // closed when inflight reaches 0 while draining

	cache       cache.Cache
	runCtx      context.Context
	stopRuntime context.CancelFunc
	runtimeDone chan struct{}
	objects     atomic.Int64
}

func newShard(r *Replica, n int32) *shard {
	return &shard{
		r:         r,
		id:        n,
		name:      strconv.Itoa(int(n)),
		log:       r.log.WithValues("shard", n),
		done:      make(chan struct{}),
		releaseCh: make(chan string, 1),
		releasing: make(chan struct{}),
	}
}

// release asks the shard to drain and release its Lease. It never blocks.
func (s *shard) release(reason string) {
	s.relOnce.Do(func() {
		s.releaseCh <- reason
		close(s.releasing)
	})
}

func (s *shard) active() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == stateActive
}

func (s *shard) synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == stateActive && s.isSynced
}

// begin admits a reconcile of this shard, unless it is no longer active.
func (s *shard) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateActive {
		return false
	}
	s.inflight++
	return true
}

func (s *shard) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	if s.inflight == 0 && s.idle != nil {
		close(s.idle)
		s.idle = nil
	}
}

// run acquires the shard, runs it, and renews its Lease until it is asked to
// release it or fails to renew in time.
func (s *shard) run(parent context.Context, reason string) {
	defer close(s.done)
	ctx := context.WithoutCancel(parent)
	start := time.Now()

	select {
	case s.r.acquires <- struct{}{}:
	case <-s.releaseCh:
		return
	}
	var slotOnce sync.Once
	freeSlot := func() { slotOnce.Do(func() { <-s.r.acquires }) }
	defer freeSlot()

	if err := s.acquire(ctx); err != nil {
		if !apierrors.IsConflict(err) && !errors.Is(err, errNotAcquirable) {
			s.log.Error(err, "Acquiring shard Lease")
		}
		return
	}
	shardHandovers.WithLabelValues("acquire", reason).Inc()
	shardsOwned.Inc()
	defer shardsOwned.Dec()
	s.log.V(1).Info("Acquired shard", "reason", reason)

	if err := s.startRuntime(ctx); err != nil {
		s.log.Error(err, "Starting shard informers; releasing the shard")
		s.stop()
		s.releaseLease(ctx)
		return
	}
	go func() {
		defer freeSlot()
		if !s.cache.WaitForCacheSync(s.runCtx) {
			return
		}
		s.mu.Lock()
		s.isSynced = s.state == stateActive
		s.mu.Unlock()
		shardAcquireDuration.Observe(time.Since(start).Seconds())
		if s.r.opts.OnAcquire != nil {
			s.r.opts.OnAcquire(s.id)
		}
		s.r.log.V(1).Info("Shard running", "shard", s.id, "took", time.Since(start))
	}()

	ticker := time.NewTicker(s.r.opts.RetryPeriod)
	defer ticker.Stop()
	var drained chan struct{}
	releaseCh := s.releaseCh
	for {
		select {
		case <-ticker.C:
			if err := s.renew(ctx); err != nil {
				s.fence(err)
				shardHandovers.WithLabelValues("release", "fenced").Inc()
				return
			}
		case reason = <-releaseCh:
			releaseCh = nil
			drained = make(chan struct{})
			go func() { defer close(drained); s.drain() }()
		case <-drained:
			s.releaseLease(ctx)
			shardHandovers.WithLabelValues("release", reason).Inc()
			s.log.V(1).Info("Released shard", "reason", reason)
			return
		}
	}
}

var errNotAcquirable = errors.New("shard Lease is held by another live replica")

func (s *shard) newRecord(now time.Time) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{
		HolderIdentity:       s.r.opts.Identity,
		LeaseDurationSeconds: int(s.r.opts.LeaseDuration / time.Second),
		AcquireTime:          metav1.NewTime(now),
		RenewTime:            metav1.NewTime(now),
	}
}

// acquire takes the shard Lease if it is free, expired or already ours,
// guarded by the Lease's resourceVersion: of two replicas racing, one wins.
func (s *shard) acquire(ctx context.Context) error {
	opts := s.r.opts
	s.lock = &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: opts.LeaseNamespace, Name: ShardLeaseName(s.id)},
		Client:     s.r.leases.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: opts.Identity},
		Labels:     map[string]string{LabelRing: opts.Ring, LabelLeaseKind: LeaseKindShard},
	}
	ctx, cancel := context.WithTimeout(ctx, opts.RenewDeadline)
	defer cancel()
	now := time.Now()
	rec := s.newRecord(now)
	old, _, err := s.lock.Get(ctx)
	switch {
	case apierrors.IsNotFound(err):
		err = s.lock.Create(ctx, rec)
	case err != nil:
		return fmt.Errorf("reading shard Lease: %w", err)
	default:
		expiry := old.RenewTime.Add(time.Duration(old.LeaseDurationSeconds) * time.Second)
		if _, ok := acquirable(&shardLease{holder: old.HolderIdentity, expiry: expiry}, opts.Identity, now); !ok {
			return errNotAcquirable
		}
		rec.LeaderTransitions = old.LeaderTransitions
		if old.HolderIdentity != opts.Identity {
			rec.LeaderTransitions++
		}
		err = s.lock.Update(ctx, rec)
	}
	if err != nil {
		return fmt.Errorf("writing shard Lease: %w", err)
	}
	s.record, s.lastRenew = rec, now
	return nil
}

// renew extends the Lease. It gives up at the renew deadline, measured from
// the local time taken before the last successful write, which is no later
// than the renew time others read: so this replica has stopped the shard
// lease duration − renew deadline before any other may take it.
func (s *shard) renew(ctx context.Context) error {
	deadline := s.lastRenew.Add(s.r.opts.RenewDeadline)
	var lastErr error
	for time.Now().Before(deadline) {
		now := time.Now()
		rec := s.record
		rec.RenewTime = metav1.NewTime(now)
		rctx, cancel := context.WithDeadline(ctx, deadline)
		err := s.lock.Update(rctx, rec)
		if apierrors.IsConflict(err) {
			// Someone wrote our Lease: reread it and keep it only if it is
			// still ours.
			var cur *resourcelock.LeaderElectionRecord
			if cur, _, err = s.lock.Get(rctx); err == nil {
				if cur.HolderIdentity != s.r.opts.Identity {
					cancel()
					return fmt.Errorf("shard Lease taken by %q", cur.HolderIdentity)
				}
				err = s.lock.Update(rctx, rec)
			}
		}
		cancel()
		if err == nil {
			s.record, s.lastRenew = rec, now
			return nil
		}
		lastErr = err
		select {
		case <-time.After(min(s.r.opts.RetryPeriod/4, time.Until(deadline))):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fmt.Errorf("renew deadline passed: %w", lastErr)
}

// fence stops the shard at once: it could not renew, so another replica may
// soon take it. In-flight reconciles see their context cancelled; their late
// writes fail on resourceVersion preconditions.
func (s *shard) fence(err error) {
	s.log.Error(err, "FENCED: could not renew the shard Lease in time; stopped the shard")
	s.stop()
}

// stop ends the runtime without waiting for reconciles.
func (s *shard) stop() {
	s.mu.Lock()
	s.state = stateStopped
	s.mu.Unlock()
	if s.stopRuntime != nil {
		s.stopRuntime()
		<-s.runtimeDone
	}
	shardObjects.DeleteLabelValues(s.name)
}

// drain stops new work, waits (bounded) for in-flight reconciles, stops the
// informers and runs the release hook. The Lease is still renewed meanwhile,
// so nobody else starts the shard before the last reconcile here ended.
func (s *shard) drain() {
	timeout := s.r.opts.DrainTimeout
	s.mu.Lock()
	s.state = stateDraining
	var idle chan struct{}
	if s.inflight > 0 {
		s.idle = make(chan struct{})
		idle = s.idle
	}
	s.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-time.After(timeout):
			s.log.Info("Drain timeout: cancelling in-flight reconciles", "timeout", timeout)
			s.stopRuntime()
			select {
			case <-idle:
			case <-time.After(timeout):
				s.log.Error(nil, "Reconciles still running after cancellation; releasing anyway")
			}
		}
	}
	s.stop()
	if s.r.opts.OnRelease != nil {
		s.r.opts.OnRelease(s.id)
	}
}

// releaseLease clears the holder so the next owner need not wait for expiry.
func (s *shard) releaseLease(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.r.opts.RenewDeadline)
	defer cancel()
	now := time.Now()
	rec := resourcelock.LeaderElectionRecord{
		LeaseDurationSeconds: 1,
		AcquireTime:          metav1.NewTime(now),
		RenewTime:            metav1.NewTime(now),
		LeaderTransitions:    s.record.LeaderTransitions,
	}
	if err := s.lock.Update(ctx, rec); err != nil {
		s.log.Error(err, "Releasing shard Lease; it expires by itself")
	}
}

// startRuntime creates the shard's cache: informers for the primary and
// owned kinds that select only this shard's label, without managed fields.
func (s *shard) startRuntime(ctx context.Context) error {
	select {
	case <-s.r.queueReady:
	case <-s.releasing:
		return errors.New("released before the controller started")
	}
	mgr := s.r.mgr
	var syncPeriod *time.Duration
	if s.r.opts.SyncPeriod > 0 {
		syncPeriod = &s.r.opts.SyncPeriod
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		SyncPeriod:                  syncPeriod,
		DefaultNamespaces:           s.r.namespaces(),
		HTTPClient:                  mgr.GetHTTPClient(),
		Scheme:                      mgr.GetScheme(),
		Mapper:                      mgr.GetRESTMapper(),
		DefaultLabelSelector:        labels.SelectorFromSet(labels.Set{LabelShard: s.name}),
		DefaultTransform:            cache.TransformStripManagedFields(),
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		return fmt.Errorf("creating shard cache: %w", err)
	}
	for _, ix := range s.r.opts.Indexes {
		if err := c.IndexField(ctx, ix.Object, ix.Field, ix.Extract); err != nil {
			return fmt.Errorf("indexing %T by %s: %w", ix.Object, ix.Field, err)
		}
	}
	s.runCtx, s.stopRuntime = context.WithCancel(ctx)
	s.runtimeDone = make(chan struct{})
	s.cache = c
	handlers := []struct {
		kind Kind
		h    toolscache.ResourceEventHandler
	}{{s.r.opts.For, s.primaryHandler()}}
	for _, k := range s.r.opts.Owns {
		handlers = append(handlers, struct {
			kind Kind
			h    toolscache.ResourceEventHandler
		}{k, s.ownedHandler(k)})
	}
	for _, h := range handlers {
		inf, err := c.GetInformer(s.runCtx, h.kind.Object)
		if err != nil {
			s.stopRuntime()
			s.stopRuntime = nil
			return fmt.Errorf("creating informer for %T: %w", h.kind.Object, err)
		}
		if _, err := inf.AddEventHandler(h.h); err != nil {
			s.stopRuntime()
			s.stopRuntime = nil
			return fmt.Errorf("adding event handler for %T: %w", h.kind.Object, err)
		}
	}
	s.mu.Lock()
	s.state = stateActive
	s.mu.Unlock()
	go func() {
		defer close(s.runtimeDone)
		if err := c.Start(s.runCtx); err != nil {
			s.log.Error(err, "Shard cache stopped")
		}
	}()
	return nil
}
