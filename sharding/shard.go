package sharding

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/backoff"
	"github.com/kshard/kshard/sharding/lease"
)

// shardState is where a shard is in its life on this replica. Every change
// of state is an event looked up in shardLifecycle, the one table of the
// shard's transitions.
type shardState int

const (
	// stateAcquiring: waiting for an acquisition slot or writing the Lease.
	stateAcquiring shardState = iota
	// stateStarting: the Lease is held; the shard waits for the cache of its
	// acquisition batch.
	stateStarting
	// stateActive: the shard reads its group's cache and admits reconciles;
	// it is synced once the group's informers are.
	stateActive
	// stateDraining: no new reconciles; in-flight ones finish.
	stateDraining
	// stateStopped: no reconcile runs, the shard left its group; the Lease
	// is being (or was) released, or was lost.
	stateStopped
)

func (st shardState) String() string {
	return [...]string{"Acquiring", "Starting", "Active", "Draining", "Stopped"}[st]
}

// shardEvent is what happens to a shard.
type shardEvent int

const (
	// eventLeaseTaken: its Lease was written with this replica as holder.
	eventLeaseTaken shardEvent = iota
	// eventCacheReady: the cache of its acquisition batch exists (it may
	// still be syncing).
	eventCacheReady
	// eventRelease: it is to be handed over; in-flight reconciles finish.
	eventRelease
	// eventStop: it stops at once: its Lease could not be taken or renewed
	// (fenced), it was released before it ran, or its drain ended.
	eventStop
)

func (ev shardEvent) String() string {
	return [...]string{"LeaseTaken", "CacheReady", "Release", "Stop"}[ev]
}

// shardLifecycle is the shard's life on one replica: for each state, where
// each event takes it. An event a state does not list changes nothing (a
// second stop, a cache that comes ready after a release). Every path ends in
// Stopped, and none goes back:
//
//	Acquiring ─LeaseTaken─► Starting ─CacheReady─► Active ─Release─► Draining ─Stop─► Stopped
//	    └─Stop─► Stopped        ├─Release─► Draining       └─Stop─► Stopped
//	                            └─Stop─► Stopped
var shardLifecycle = map[shardState]map[shardEvent]shardState{
	stateAcquiring: {eventLeaseTaken: stateStarting, eventStop: stateStopped},
	stateStarting:  {eventCacheReady: stateActive, eventRelease: stateDraining, eventStop: stateStopped},
	stateActive:    {eventRelease: stateDraining, eventStop: stateStopped},
	stateDraining:  {eventStop: stateStopped},
}

// shard is the runtime of one shard on this replica: its Lease, the group
// whose cache it reads, and the count of its in-flight reconciles. One
// goroutine (run) owns the Lease from acquisition to release, so renewals,
// fencing and release never race each other.
type shard struct {
	c    *coordinator
	id   int32
	name string
	log  logr.Logger

	done      chan struct{} // closed when run returns
	releaseCh chan string   // the release reason; buffered, sent once
	relOnce   sync.Once

	lease   *leaseWriter
	started time.Time
	// ended is how run ended, and acquireErr why the Lease could not be
	// taken; both read after run.
	ended      tenureEnd
	acquireErr error

	// ctx is cancelled when the shard stops: in-flight reconciles see it.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	state    shardState
	group    *group
	inflight int
	idle     chan struct{} // closed when inflight reaches 0 while draining
	// hooks serialises OnAcquire and OnRelease, so each runs at most once
	// per tenure and OnRelease only after OnAcquire.
	hooks              sync.Mutex
	acquired, released bool
	// lastRenew is the local time, monotonic, taken before the last
	// successful Lease write: never later than the renew time others
	// observe, so lastRenew + RenewDeadline ends this replica's writes
	// LeaseDuration − RenewDeadline before anyone may take the shard.
	lastRenew time.Time
}

func newShard(c *coordinator, n int32) *shard {
	ctx, cancel := context.WithCancel(context.Background())
	return &shard{
		c:         c,
		id:        n,
		name:      strconv.Itoa(int(n)),
		log:       c.log.WithValues("shard", n),
		done:      make(chan struct{}),
		releaseCh: make(chan string, 1),
		started:   time.Now(),
		ctx:       ctx,
		cancel:    cancel,
	}
}

// waitForSync waits until the shard's group has synced, and reports false
// when the shard stopped (or ctx ended) first.
func (s *shard) waitForSync(ctx context.Context) bool {
	s.mu.Lock()
	g := s.group
	s.mu.Unlock()
	if g == nil {
		return false
	}
	select {
	case <-g.synced:
		return s.synced()
	case <-g.done:
	case <-s.ctx.Done():
	case <-ctx.Done():
	}
	return false
}

// fire moves the shard along shardLifecycle and reports whether the event
// changed its state. Caller holds s.mu.
func (s *shard) fire(ev shardEvent) bool {
	to, ok := shardLifecycle[s.state][ev]
	if !ok {
		return false
	}
	s.log.V(1).Info("Shard state", "from", s.state, "to", to, "event", ev)
	s.state = to
	return true
}

// release asks the shard to drain and release its Lease. It never blocks.
func (s *shard) release(reason string) {
	s.relOnce.Do(func() { s.releaseCh <- reason })
}

func (s *shard) is(st shardState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == st
}

func (s *shard) active() bool { return s.is(stateActive) }

// synced reports whether the shard runs with synced informers.
func (s *shard) synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == stateActive && s.group != nil && s.group.isSynced()
}

// reads reports whether the shard is active and reads group g: only then do
// g's events become the shard's requests.
func (s *shard) reads(g *group) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == stateActive && s.group == g
}

// reader reads the shard's objects from group g's cache.
func (s *shard) reader(g *group) client.Reader {
	return shardReader{c: g.cache, key: s.c.keys.Shard, shard: s.name, scheme: s.c.mgr.GetScheme()}
}

// currentReader reads the shard's objects from its group, if active.
func (s *shard) currentReader() (client.Reader, bool) {
	s.mu.Lock()
	g := s.group
	ok := s.state == stateActive
	s.mu.Unlock()
	if !ok || g == nil {
		return nil, false
	}
	return s.reader(g), true
}

// activate makes a starting shard read group g and admit reconciles. It
// reports false when the shard was stopped meanwhile.
func (s *shard) activate(g *group) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.fire(eventCacheReady) {
		return false
	}
	g.join()
	s.group = g
	return true
}

// regroup moves an active shard from group from to group to (compaction).
func (s *shard) regroup(from, to *group) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateActive || s.group != from {
		return false
	}
	to.join()
	s.group = to
	return true
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

// run acquires the shard, joins an acquisition batch, and renews the Lease
// until it is asked to release it or fails to renew in time.
func (s *shard) run(parent context.Context, reason string) {
	defer close(s.done)
	ctx := context.WithoutCancel(parent)

	select {
	case s.c.acquires <- struct{}{}:
	case <-s.releaseCh:
		s.stop()
		return
	}
	err := s.acquire(ctx)
	<-s.c.acquires
	s.acquireErr = err
	if err != nil {
		s.ended = endNotTaken
		if !apierrors.IsConflict(err) && !errors.Is(err, errLeaseHeld) {
			s.log.Error(err, "Acquiring shard Lease")
		}
		s.stop()
		return
	}
	s.c.metrics.handovers.WithLabelValues("acquire", reason).Inc()
	s.c.metrics.owned.Inc()
	defer s.c.metrics.owned.Dec()
	s.log.V(1).Info("Acquired shard", "reason", reason)
	s.mu.Lock()
	s.fire(eventLeaseTaken)
	s.mu.Unlock()
	s.c.joinBatch(parent, s)

	// The first renewal comes at a random point of the retry period: shards
	// acquired together (a replica's start takes all of its shards at once)
	// would otherwise renew together ever after, a burst of Lease writes
	// every period that the API server serves at once and that a replica
	// held to a CPU limit pays with its reconciles stalled. Every renewal
	// still comes within the renew deadline (above 1.2 × the period).
	next := time.Now().Add(backoff.Between(0, s.c.opts.RetryPeriod) + 1)
	renewal := time.NewTimer(time.Until(next))
	defer renewal.Stop()
	var drained chan bool
	releaseCh := s.releaseCh
	renewed := false
	for {
		select {
		case <-renewal.C:
			if err := s.renew(ctx); err != nil {
				s.ended = endFenced
				s.fence(err)
				s.c.metrics.handovers.WithLabelValues("release", "fenced").Inc()
				return
			}
			if !renewed {
				// Held through a renewal: a backoff of fences before
				// this tenure is over.
				renewed = true
				s.c.forgive(s.id)
			}
			// On the schedule, as a ticker: a slow renewal does not push
			// the next one toward the deadline, and the periods it
			// overran are skipped.
			for now := time.Now(); !next.After(now); {
				next = next.Add(s.c.opts.RetryPeriod)
			}
			renewal.Reset(time.Until(next))
		case reason = <-releaseCh:
			releaseCh = nil
			drained = make(chan bool, 1)
			go func() { drained <- s.drain() }()
		case idle := <-drained:
			if !idle {
				// A reconcile outlived its cancellation: clearing the
				// holder would let the next owner start beside it. Stop
				// renewing instead; its writes end at the renew deadline,
				// before the Lease expires for anyone else.
				s.c.metrics.handovers.WithLabelValues("release", "expired").Inc()
				s.log.Error(nil, "Reconciles still running after drain; leaving the shard Lease to expire", "reason", reason)
				return
			}
			s.releaseLease(ctx)
			s.c.metrics.handovers.WithLabelValues("release", reason).Inc()
			s.log.V(1).Info("Released shard", "reason", reason)
			return
		}
	}
}

// onSynced runs once the shard's first group synced.
func (s *shard) onSynced() {
	s.c.metrics.acquire.Observe(time.Since(s.started).Seconds())
	s.log.V(1).Info("Shard running", "took", time.Since(s.started))
}

// beginTenure runs OnAcquire, once, if the shard is still active.
func (s *shard) beginTenure() {
	s.hooks.Lock()
	defer s.hooks.Unlock()
	if s.acquired || !s.active() {
		return
	}
	s.acquired = true
	if s.c.opts.OnAcquire != nil {
		s.c.opts.OnAcquire(s.ctx, s.id)
	}
}

// endTenure runs OnRelease, once, if OnAcquire ran.
func (s *shard) endTenure() {
	s.hooks.Lock()
	defer s.hooks.Unlock()
	if !s.acquired || s.released {
		return
	}
	s.released = true
	if s.c.opts.OnRelease != nil {
		s.c.opts.OnRelease(s.id)
	}
}

// acquire takes the shard Lease if it is absent, free, expired or already
// this process's, guarded by the Lease's resourceVersion: of two replicas
// racing, one wins.
func (s *shard) acquire(ctx context.Context) error {
	opts := s.c.opts
	s.lease = s.c.newLeaseWriter(lease.ShardName(opts.Ring, s.id),
		map[string]string{s.c.keys.Ring: opts.Ring, s.c.keys.LeaseKind: lease.KindShard}, nil)
	ctx, cancel := context.WithTimeout(ctx, opts.RenewDeadline)
	defer cancel()
	now := time.Now()
	if _, err := s.lease.take(ctx); err != nil {
		return fmt.Errorf("taking shard Lease: %w", err)
	}
	s.renewed(now)
	return nil
}

// renewed records a successful Lease write begun at now.
func (s *shard) renewed(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastRenew = now
}

// holdUntil returns when this replica's hold of the shard ends: RenewDeadline
// after its last renewal, on the monotonic clock. ok is false when the shard
// may not be written now: it is not active or draining, or a pause (GC,
// CPU throttling, SIGSTOP, a frozen VM) outlasted the renew deadline before
// the renewal loop could notice and fence.
func (s *shard) holdUntil(now time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateActive && s.state != stateDraining {
		return time.Time{}, false
	}
	until := s.lastRenew.Add(s.c.opts.RenewDeadline)
	return until, now.Before(until)
}

// renew extends the Lease until the renew deadline after its last renewal
// (leaseWriter.renewBefore): past it, another replica may soon take the
// shard.
func (s *shard) renew(ctx context.Context) error {
	s.mu.Lock()
	deadline := s.lastRenew.Add(s.c.opts.RenewDeadline)
	s.mu.Unlock()
	at, err := s.lease.renewBefore(ctx, deadline, s.c.opts.RetryPeriod/4)
	if err != nil {
		return err
	}
	s.renewed(at)
	return nil
}

// fence stops the shard at once: it could not renew, so another replica may
// soon take it. In-flight reconciles see their context cancelled; their late
// writes fail on resourceVersion preconditions.
func (s *shard) fence(err error) {
	s.log.Error(err, "FENCED: could not renew the shard Lease in time; stopped the shard")
	s.stop()
}

// stop ends the shard without waiting for reconciles: it cancels them and
// leaves its group (whose cache stops when no shard reads it any more).
func (s *shard) stop() {
	s.mu.Lock()
	s.fire(eventStop)
	g := s.group
	s.group = nil
	s.mu.Unlock()
	s.cancel()
	s.c.unbatch(s)
	if g != nil {
		g.leave()
	}
	s.c.metrics.objects.DeleteLabelValues(s.name)
	s.endTenure()
}

// drain stops new work, waits (bounded) for in-flight reconciles, and stops
// the shard, which leaves its group and runs the release hook. The Lease is
// still renewed meanwhile, so nobody else starts the shard before the last
// reconcile here ended. It reports whether every reconcile ended.
func (s *shard) drain() bool {
	timeout := s.c.opts.DrainTimeout
	s.mu.Lock()
	s.fire(eventRelease)
	var idle chan struct{}
	if s.inflight > 0 {
		s.idle = make(chan struct{})
		idle = s.idle
	}
	s.mu.Unlock()
	ended := true
	if idle != nil {
		select {
		case <-idle:
		case <-time.After(timeout):
			s.log.Info("Drain timeout: cancelling in-flight reconciles", "timeout", timeout)
			s.cancel()
			select {
			case <-idle:
			case <-time.After(timeout):
				ended = false
			}
		}
	}
	s.stop()
	return ended
}

// releaseLease clears the holder so the next owner need not wait for expiry.
func (s *shard) releaseLease(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.c.opts.RenewDeadline)
	defer cancel()
	if err := s.lease.release(ctx); err != nil {
		s.log.Error(err, "Releasing shard Lease; it expires by itself")
	}
}
