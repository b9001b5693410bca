package sharding

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/internal/backoff"
	"github.com/kshard/kshard/sharding/ring"
)

// The coordinator: one pass (sync) reads the ring's Leases from their watch,
// recomputes the ring and this replica's wanted shards, and starts or releases
// shards; it runs on every change of holder or membership and at the next
// expiry.

// coordinator runs a replica's shards: it watches the ring's Leases,
// computes the ring and the shards it gives this replica, starts and
// releases their runtimes (shard.go), and batches the shards it acquires
// together into one informer cache (group.go).
type coordinator struct {
	*env
	// member says whether this process is in the ring as itself; labeler
	// is woken on every pass, as it campaigns only while it is.
	member  *memberLease
	labeler *labeler

	// ringLeases are the ring's Leases as last listed and watched, set
	// once by watchLeases.
	ringLeases *objectWatch
	kick       chan struct{}

	mu       sync.Mutex
	ring     *ring.Ring
	mismatch bool
	shards   map[int32]*shard
	acquires chan struct{} // bounds concurrent Lease acquisitions
	open     *batch        // the acquisition batch shards join, if any
	groups   map[*group]bool
	backoff  map[int32]*acquireBackoff
	// warm is the cache this replica syncs for the shards leaving members
	// hand it (warmup.go), if any.
	warm *warmup

	// sts says which members the StatefulSet no longer wants, if one is
	// configured: they count as leaving (statefulset.go).
	sts *statefulSetWatch
	// leaving says this replica was, at the last pass, a member that
	// announced its leave or that the StatefulSet no longer wants.
	leaving bool

	// expected are the StatefulSet's desired members, read at start; they
	// count as ring members until StartupGrace after started, so a replica
	// that starts before its peers claims only its own share.
	expected []string
	started  time.Time
}

func newCoordinator(e *env) *coordinator {
	return &coordinator{
		env:      e,
		kick:     make(chan struct{}, 1),
		ring:     ring.New(e.opts.Shards, nil),
		shards:   map[int32]*shard{},
		acquires: make(chan struct{}, 16),
		groups:   map[*group]bool{},
		backoff:  map[int32]*acquireBackoff{},
	}
}

// watchLeases starts the watch of the ring's Leases (watch.go), whose every
// change of holder or member wakes the coordinator, and waits for its first
// list. stop ends the watch and waits for it.
func (c *coordinator) watchLeases(ctx context.Context) (stop func(), err error) {
	leaseCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	lw := toolscache.NewFilteredListWatchFromClient(c.leases.CoordinationV1().RESTClient(), "leases", c.opts.LeaseNamespace,
		func(o *metav1.ListOptions) {
			o.LabelSelector = labels.SelectorFromSet(labels.Set{c.keys.Ring: c.opts.Ring}).String()
		})
	w, done := startWatch(leaseCtx, "ring-leases", lw, &coordinationv1.Lease{}, c.opts.RetryPeriod, func(old, new any) {
		if old != nil && new != nil {
			c.leaseUpdated(old, new)
			return
		}
		c.wake()
	})
	stop = func() { cancel(); <-done }
	if !w.waitForSync(ctx) {
		stop()
		return nil, fmt.Errorf("syncing ring Leases: %w", context.Cause(ctx))
	}
	c.mu.Lock()
	c.ringLeases = w
	c.mu.Unlock()
	return stop, nil
}

// expect starts the startup grace: members count as in the ring until
// StartupGrace from now.
func (c *coordinator) expect(members []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started, c.expected = time.Now(), members
}

// leaseUpdated wakes the coordinator for a Lease change that may move a
// shard or a member: a new holder, acquisition, duration or transition. A
// renewal alone (a new renew time, every retry period for every shard and
// member: 13 a second in a ring of 64 shards) changes nothing but when the
// Lease expires: it is noted as seen now, and the coordinator reads it at
// its next pass (the next expiry, at the latest a retry period on), not in
// a pass of its own on every replica.
func (c *coordinator) leaseUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*coordinationv1.Lease)
	l, ok2 := newObj.(*coordinationv1.Lease)
	if !ok1 || !ok2 || !renewalOnly(old, l) {
		c.wake()
		return
	}
	c.observed.expiry(l.Name, ptr.Deref(l.Spec.HolderIdentity, ""), l.Spec.RenewTime.Time,
		time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second, time.Now())
}

// renewalOnly says a Lease changed only its renew time: not its labels or
// annotations (a member's shard count), nor any other field of its spec.
func renewalOnly(a, b *coordinationv1.Lease) bool {
	if a.Spec.RenewTime == nil || b.Spec.RenewTime == nil ||
		!maps.Equal(a.Labels, b.Labels) || !maps.Equal(a.Annotations, b.Annotations) {
		return false
	}
	x, y := a.Spec, b.Spec
	x.RenewTime, y.RenewTime = nil, nil
	return equality.Semantic.DeepEqual(x, y)
}

func (c *coordinator) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// run recomputes the ring and the wanted shards on every Lease event and at
// the next time a Lease may expire, until ctx is done.
func (c *coordinator) run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-timer.C:
		}
		next := c.sync(ctx)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(next)
	}
}

// sync is one pass of the coordinator. It returns how long until it should
// look again when nothing happens.
func (c *coordinator) sync(ctx context.Context) time.Duration {
	c.metrics.syncs.Inc()
	now := time.Now()
	view, err := c.read(ctx, now)
	if err != nil {
		c.log.Error(err, "Reading the ring")
		return c.opts.RetryPeriod
	}
	next := now.Add(c.opts.RetryPeriod)
	for _, t := range view.Expiries {
		if t.After(now) && t.Before(next) {
			next = t
		}
	}

	c.metrics.members.Set(float64(len(view.Members)))
	c.metrics.unowned.Set(float64(view.Unowned(now)))

	c.mu.Lock()
	defer c.mu.Unlock()
	// Whatever this pass changed, the labeler looks again: it campaigns
	// only while this replica is in the ring.
	defer c.labeler.wake()
	mismatch := view.ShardCount != 0 && view.ShardCount != c.opts.Shards
	if mismatch != c.mismatch {
		c.mismatch = mismatch
		if mismatch {
			c.metrics.mismatch.Set(1)
			c.log.Error(nil, "REFUSING TO CLAIM SHARDS: this replica's shard count differs from the ring's; fix --shards",
				"mine", c.opts.Shards, "ring", view.ShardCount)
		} else {
			c.metrics.mismatch.Set(0)
		}
	}
	if mismatch {
		for _, s := range c.shards {
			s.release("mismatch")
		}
		return time.Until(next)
	}
	if !c.member.held() {
		// Not in the ring as this process (yet, or another process runs
		// this identity): claim nothing.
		for _, s := range c.shards {
			s.release("identity")
		}
		return time.Until(next)
	}

	// A leaving member (warmup.go), or one the StatefulSet no longer wants,
	// keeps the shards it holds until it releases them, but the ring is
	// computed without it: its successors warm up for what they will take,
	// and it claims nothing more.
	members := slices.DeleteFunc(slices.Clone(view.Members), func(m string) bool { return slices.Contains(view.Leaving, m) })
	leaving := slices.Contains(view.Leaving, c.opts.Identity)
	c.leaving = leaving
	if graceEnd := c.started.Add(c.opts.StartupGrace); len(c.expected) > 0 && now.Before(graceEnd) {
		unwanted := c.sts.unwanted(c.expected)
		for _, m := range c.expected {
			if !slices.Contains(view.Leaving, m) && !slices.Contains(unwanted, m) && !slices.Contains(members, m) {
				members = append(members, m)
			}
		}
		slices.Sort(members)
		if graceEnd.Before(next) {
			next = graceEnd
		}
	}
	// A ring hashes ringReplicationFactor virtual nodes per member, and sync
	// runs on every Lease event: build one only when the members changed.
	if !slices.Equal(c.ring.Members(), slices.Sorted(slices.Values(members))) {
		c.ring = ring.New(c.opts.Shards, members)
	}
	current := c.ring
	for n := range c.opts.Shards {
		desired := current.Owner(n) == c.opts.Identity
		s, have := c.shards[n]
		switch {
		case desired && !have:
			if b, ok := c.backoff[n]; ok && now.Before(b.notBefore) {
				next = minTime(next, b.notBefore)
				continue
			}
			if reason, ok := view.Shards[n].State(c.holder, now).Takeable(); ok {
				c.startShard(ctx, n, reason)
			}
		case !desired && have && !leaving:
			s.release("rebalance")
		}
	}
	c.warmLocked(ctx, view, current)
	c.compactLocked(ctx, current)
	return time.Until(next)
}

// read builds the ring's view of its Leases from their watch, timing each
// Lease's expiry on this replica's clock from when it saw the Lease renewed.
// Its Leaving members are those that announce it and those the StatefulSet
// no longer wants. Without deep copies: it runs on every change of holder
// or member, at every expiry and every retry period, and ring.Read only
// reads the watched Leases, keeping none of them.
func (c *coordinator) read(ctx context.Context, now time.Time) (*ring.View, error) {
	c.mu.Lock()
	w := c.ringLeases
	c.mu.Unlock()
	if w == nil {
		return nil, errors.New("the ring's Leases are not watched yet")
	}
	objs := w.List()
	items := make([]coordinationv1.Lease, 0, len(objs))
	for _, o := range objs {
		if l, ok := o.(*coordinationv1.Lease); ok {
			items = append(items, *l)
		}
	}
	view := ring.Read(c.keys.Keys, c.opts.Ring, items, c.opts.Shards, now, func(l *coordinationv1.Lease) time.Time {
		renew := time.Time{}
		if l.Spec.RenewTime != nil {
			renew = l.Spec.RenewTime.Time
		}
		return c.observed.expiry(l.Name, ptr.Deref(l.Spec.HolderIdentity, ""), renew, time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second, now)
	})
	for _, m := range c.sts.unwanted(view.Members) {
		if !slices.Contains(view.Leaving, m) {
			view.Leaving = append(view.Leaving, m)
		}
	}
	return view, nil
}

// startShard begins acquiring a shard. Caller holds c.mu.
func (c *coordinator) startShard(ctx context.Context, n int32, reason string) {
	s := newShard(c, n)
	c.shards[n] = s
	go func() {
		s.run(ctx, reason)
		c.mu.Lock()
		if c.shards[n] == s {
			delete(c.shards, n)
		}
		c.noteTenureLocked(n, s.ended, s.acquireErr)
		c.mu.Unlock()
		c.wake()
	}()
}

// acquireBackoff spaces out attempts at a shard. A Lease that could not be
// taken (a live holder the ring does not know of, a failing API server) is
// not retried in a hot loop. A shard fenced (its renewals missed their
// deadline) is not taken back at once either: a fence says this replica, or
// the API server it writes to, is overloaded, and taking the shard back at
// once adds the shard's reconciles and external fetches to that load before
// the next renewals are due. A replica held to 50m of CPU fenced its own
// shards 449 times in a start that way, and never settled (docs/scale.md).
type acquireBackoff struct {
	delays backoff.Delays
	// fenced says delays are a fence's, counted from its first fence: the
	// delays of failed takes before it were shorter.
	fenced    bool
	failures  int
	notBefore time.Time
}

// tenureEnd is how a shard's run on this replica ended, as its backoff
// counts it.
type tenureEnd int

const (
	// endReleased: it was released, or handed over; a later acquisition
	// need not wait.
	endReleased tenureEnd = iota
	// endNotTaken: its Lease could not be taken.
	endNotTaken
	// endFenced: it was held, and stopped when a renewal missed its
	// deadline or found the Lease gone.
	endFenced
)

// noteTenureLocked records how a run of shard n ended. A Lease that could
// not be taken backs off 100 ms, doubling, to at most RetryPeriod; a fence
// backs off RetryPeriod, doubling, to at most LeaseDuration: a shard fenced
// at its renew deadline has been expired at most RenewDeadline when this
// replica may take it again, less than the ring's unowned bound. The
// failures are forgotten when the shard is released, or renewed once after
// it was taken again (forgive). Caller holds c.mu.
func (c *coordinator) noteTenureLocked(n int32, end tenureEnd, err error) {
	if end == endReleased {
		delete(c.backoff, n)
		return
	}
	b := c.backoff[n]
	switch fenced := end == endFenced; {
	case fenced && (b == nil || !b.fenced):
		b = &acquireBackoff{fenced: true, delays: backoff.Policy{Initial: c.opts.RetryPeriod, Max: c.opts.LeaseDuration}.Delays()}
		c.backoff[n] = b
	case b == nil:
		b = &acquireBackoff{delays: backoff.Policy{Initial: min(100*time.Millisecond, c.opts.RetryPeriod), Max: c.opts.RetryPeriod}.Delays()}
		c.backoff[n] = b
	}
	b.failures++
	delay := b.delays.Next()
	b.notBefore = time.Now().Add(delay)
	switch {
	case end == endFenced:
		c.log.V(1).Info("Shard fenced; taking it again after a backoff", "shard", n, "fences", b.failures, "backoff", delay)
	case b.failures == 3:
		c.log.Info("Cannot acquire a shard Lease; backing off", "shard", n, "attempts", b.failures, "reason", err.Error())
	}
}

// forgive forgets the backoff of shard n: it was taken again and renewed.
func (c *coordinator) forgive(n int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.backoff, n)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// releaseAll drains and releases every shard and waits for them.
func (c *coordinator) releaseAll(reason string) {
	c.mu.Lock()
	if c.warm != nil {
		c.endWarmupLocked(c.warm)
	}
	held := make([]*shard, 0, len(c.shards))
	for _, s := range c.shards {
		held = append(held, s)
	}
	c.mu.Unlock()
	for _, s := range held {
		s.release(reason)
	}
	for _, s := range held {
		<-s.done
	}
}

// shard returns the runtime of a shard this replica holds, if any.
func (c *coordinator) shard(n int32) *shard {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shards[n]
}

// heldShards lists the shards this replica runs, sorted.
func (c *coordinator) heldShards() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int32
	for n := range c.opts.Shards {
		if s, ok := c.shards[n]; ok && s.active() {
			out = append(out, n)
		}
	}
	return out
}

// inRing reports why the ring, as last computed, does not let this replica
// act for it: its shard count differs from the ring's, or the ring does not
// have it yet.
func (c *coordinator) inRing() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mismatch {
		return fmt.Errorf("shard count %d differs from the ring's", c.opts.Shards)
	}
	if c.leaving {
		return errLeaving
	}
	if !slices.Contains(c.ring.Members(), c.opts.Identity) {
		return fmt.Errorf("not a ring member yet")
	}
	return nil
}

// errLeaving says this replica leaves the ring: it announced so, or the
// StatefulSet no longer wants it. It takes no shard and does not label.
var errLeaving = errors.New("leaving the ring")

// missing lists the shards the ring gives this replica that it does not
// run yet with synced informers.
func (c *coordinator) missing() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int32
	for _, n := range c.ring.ShardsOf(c.opts.Identity) {
		if s, ok := c.shards[n]; !ok || !s.synced() {
			out = append(out, n)
		}
	}
	return out
}
