package sharding

import (
	"context"
	"maps"
	"math"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The coordinator: one pass (sync) reads the ring's Leases from the cache,
// recomputes the ring and this replica's wanted shards, and starts or releases
// shards; it runs on every change of holder or membership and at the next
// expiry.

// leaseUpdated wakes the coordinator for a Lease change that may move a
// shard or a member: a new holder, acquisition, duration or transition. A
// renewal alone (a new renew time, every retry period for every shard and
// member: 13 a second in a ring of 64 shards) changes nothing but when the
// Lease expires: it is noted as seen now, and the coordinator reads it at
// its next pass (the next expiry, at the latest a retry period on), not in
// a pass of its own on every replica.
func (r *Replica) leaseUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*coordinationv1.Lease)
	l, ok2 := newObj.(*coordinationv1.Lease)
	if !ok1 || !ok2 || !renewalOnly(old, l) {
		r.wake()
		return
	}
	r.observed.expiry(l.Name, ptr.Deref(l.Spec.HolderIdentity, ""), l.Spec.RenewTime.Time,
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

func (r *Replica) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// coordinate recomputes the ring and the wanted shards on every Lease event
// and at the next time a Lease may expire, until ctx is done.
func (r *Replica) coordinate(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-timer.C:
		}
		next := r.sync(ctx)
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
func (r *Replica) sync(ctx context.Context) time.Duration {
	r.metrics.syncs.Inc()
	var list coordinationv1.LeaseList
	// Without deep copies: sync runs on every change of holder or member,
	// at every expiry and every retry period, and readLeases only reads the
	// cached Leases, keeping none of them.
	if err := r.leaseCache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		r.log.Error(err, "Listing ring Leases")
		return r.opts.RetryPeriod
	}
	now := time.Now()
	next := now.Add(r.opts.RetryPeriod)
	view := readLeases(r.keys, r.opts.Ring, list.Items, r.opts.Shards, now, func(l *coordinationv1.Lease) time.Time {
		renew := time.Time{}
		if l.Spec.RenewTime != nil {
			renew = l.Spec.RenewTime.Time
		}
		return r.observed.expiry(l.Name, ptr.Deref(l.Spec.HolderIdentity, ""), renew, time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0))*time.Second, now)
	})
	for _, t := range view.expiries {
		if t.After(now) && t.Before(next) {
			next = t
		}
	}

	r.metrics.members.Set(float64(len(view.members)))
	r.metrics.unowned.Set(float64(view.unowned()))

	r.mu.Lock()
	defer r.mu.Unlock()
	// Whatever this pass changed, the labeler looks again: it campaigns
	// only while this replica is in the ring.
	defer r.labeler.wake()
	mismatch := view.shardCount != 0 && view.shardCount != r.opts.Shards
	if mismatch != r.mismatch {
		r.mismatch = mismatch
		if mismatch {
			r.metrics.mismatch.Set(1)
			r.log.Error(nil, "REFUSING TO CLAIM SHARDS: this replica's shard count differs from the ring's; fix --shards",
				"mine", r.opts.Shards, "ring", view.shardCount)
		} else {
			r.metrics.mismatch.Set(0)
		}
	}
	if mismatch {
		for _, s := range r.shards {
			s.release("mismatch")
		}
		return time.Until(next)
	}
	if !r.member.held() {
		// Not in the ring as this process (yet, or another process runs
		// this identity): claim nothing.
		for _, s := range r.shards {
			s.release("identity")
		}
		return time.Until(next)
	}

	members := view.members
	if graceEnd := r.started.Add(r.opts.StartupGrace); len(r.expected) > 0 && now.Before(graceEnd) {
		members = slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(members), r.expected...))))
		if graceEnd.Before(next) {
			next = graceEnd
		}
	}
	// A ring hashes ringReplicationFactor virtual nodes per member, and sync
	// runs on every Lease event: build one only when the members changed.
	if !slices.Equal(r.ring.Members(), slices.Sorted(slices.Values(members))) {
		r.ring = NewRing(r.opts.Shards, members)
	}
	ring := r.ring
	for n := range r.opts.Shards {
		desired := ring.Owner(n) == r.opts.Identity
		s, have := r.shards[n]
		switch {
		case desired && !have:
			if b, ok := r.backoff[n]; ok && now.Before(b.notBefore) {
				next = minTime(next, b.notBefore)
				continue
			}
			lease := view.shards[n]
			if reason, ok := lease.state(r.holder, now).Takeable(); ok {
				r.startShard(ctx, n, reason)
			}
		case !desired && have:
			s.release("rebalance")
		}
	}
	r.compactLocked(ctx, ring)
	return time.Until(next)
}

// startShard begins acquiring a shard. Caller holds r.mu.
func (r *Replica) startShard(ctx context.Context, n int32, reason string) {
	s := newShard(r, n)
	r.shards[n] = s
	go func() {
		s.run(ctx, reason)
		r.mu.Lock()
		if r.shards[n] == s {
			delete(r.shards, n)
		}
		r.noteAcquisitionLocked(n, s.acquireErr)
		r.mu.Unlock()
		r.wake()
	}()
}

// acquireBackoff spaces out attempts at a shard Lease that could not be
// taken, so a Lease that stays out of reach (a live holder the ring does not
// know of, a failing API server) is not retried in a hot loop.
type acquireBackoff struct {
	delays    wait.Backoff
	failures  int
	notBefore time.Time
}

// noteAcquisitionLocked records how an attempt at shard n ended: a failure
// backs off (100 ms, doubling, at most RetryPeriod), a success forgets the
// failures. Caller holds r.mu.
func (r *Replica) noteAcquisitionLocked(n int32, err error) {
	if err == nil {
		delete(r.backoff, n)
		return
	}
	b := r.backoff[n]
	if b == nil {
		b = &acquireBackoff{delays: wait.Backoff{Duration: min(100*time.Millisecond, r.opts.RetryPeriod), Factor: 2,
			Cap: r.opts.RetryPeriod, Steps: math.MaxInt32}}
		r.backoff[n] = b
	}
	b.failures++
	b.notBefore = time.Now().Add(b.delays.Step())
	if b.failures == 3 {
		r.log.Info("Cannot acquire a shard Lease; backing off", "shard", n, "attempts", b.failures, "reason", err.Error())
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
