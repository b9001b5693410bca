package sharding

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
)

// memberState is where this process is with its identity's member Lease.
type memberState int

const (
	// memberJoining: the member Lease has not been read or written yet.
	memberJoining memberState = iota
	// memberHeld: this incarnation holds the member Lease; the replica is
	// in the ring and may claim shards.
	memberHeld
	// memberWaiting: another process (another incarnation of this
	// identity) renews the member Lease; this one claims nothing and is not
	// ready until that Lease expires or is handed over.
	memberWaiting
)

func (st memberState) String() string { return [...]string{"Joining", "Held", "Waiting"}[st] }

// memberLease keeps this replica's member Lease fresh. Its presence, not any
// shard Lease, is what puts a replica in the ring; its holder,
// "<replica>_<incarnation>", is what keeps a second process with the same
// identity out.
type memberLease struct {
	r     *Replica
	lease *leaseWriter

	mu     sync.Mutex
	state  memberState
	holder string // the other incarnation, while waiting
}

func newMemberLease(r *Replica) *memberLease {
	opts := r.opts
	return &memberLease{r: r, lease: r.newLeaseWriter(MemberLeaseName(opts.Ring, opts.Identity),
		map[string]string{r.keys.ring: opts.Ring, r.keys.leaseKind: LeaseKindMember},
		map[string]string{r.keys.shards: strconv.Itoa(int(opts.Shards))})}
}

// run renews the member Lease every RetryPeriod until ctx is done. A renewal
// in flight when ctx ends finishes (within RenewDeadline) rather than being
// cancelled: a cancelled update may land without its answer being read,
// which left the Lease unknown, so the stopping replica's delete skipped the
// Lease and the others waited for it to expire instead of taking its shards
// at once (TestGracefulLeaveAndJoin, under load).
func (m *memberLease) run(ctx context.Context) {
	renewCtx := context.WithoutCancel(ctx)
	m.renewOnce(renewCtx)
	t := time.NewTicker(m.r.opts.RetryPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.renewOnce(renewCtx)
		}
	}
}

// setState moves to a state, logs the change and wakes the coordinator.
func (m *memberLease) setState(st memberState, other string) {
	m.mu.Lock()
	from := m.state
	m.state, m.holder = st, other
	m.mu.Unlock()
	if from == st {
		return
	}
	switch st {
	case memberWaiting:
		m.r.log.Info("REPLICA IDENTITY IN USE: another process renews this replica's member Lease; claiming nothing until it stops",
			"holder", other, "mine", m.r.holder)
	default:
		m.r.log.Info("Member Lease", "state", st, "holder", m.r.holder)
	}
	m.r.wake()
}

// held reports whether this incarnation holds the member Lease.
func (m *memberLease) held() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state == memberHeld
}

// notHeldReason says why this incarnation does not hold the member Lease,
// nil when it does.
func (m *memberLease) notHeldReason() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.state {
	case memberHeld:
		return nil
	case memberWaiting:
		return fmt.Errorf("replica identity %q is in use by another process (member Lease holder %q, this process %q): waiting for it to stop renewing",
			m.r.opts.Identity, m.holder, m.r.holder)
	}
	return errors.New("member Lease not written yet")
}

// renewOnce creates, takes or renews the member Lease. It takes a Lease
// that is free, this incarnation's, kept for the next incarnation (holder
// without incarnation), or another incarnation's that this replica has not
// seen renewed for its duration; it waits on one that another incarnation
// still renews. Conflicts read it again.
func (m *memberLease) renewOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, m.r.opts.RenewDeadline)
	defer cancel()
	for attempt := 0; attempt < 3; attempt++ {
		var err error
		if m.held() {
			err = m.lease.renew(ctx)
		} else {
			var reason string
			reason, err = m.lease.take(ctx)
			if reason == "expired" {
				m.r.log.Info("Took over this replica's member Lease from a process that stopped renewing it")
			}
		}
		var held *heldError
		switch {
		case err == nil:
			m.setState(memberHeld, "")
			return
		case errors.As(err, &held):
			m.setState(memberWaiting, held.holder)
			return
		case errors.Is(err, errLeaseLost):
			m.setState(memberJoining, "")
		case !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsNotFound(err):
			m.r.log.Error(err, "Renewing member Lease")
			return
		}
	}
}

// handOver renews the member Lease once more in the name of the replica,
// without this process's incarnation: the ring keeps the replica while it
// restarts, and its next incarnation takes the Lease at once.
func (m *memberLease) handOver(ctx context.Context) {
	if !m.held() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.r.opts.RenewDeadline)
	defer cancel()
	if err := m.lease.handOver(ctx, m.r.opts.Identity); err != nil {
		m.r.log.Error(err, "Handing the member Lease over to the next incarnation; it waits for the Lease to expire")
	}
}

// delete removes the member Lease, if this incarnation still holds it: the
// replica leaves the ring.
func (m *memberLease) delete(ctx context.Context) {
	if !m.held() {
		return
	}
	if err := m.lease.delete(ctx); err != nil {
		m.r.log.Error(err, "Deleting member Lease; the ring drops this replica when it expires")
	}
}

// leaseView is what the ring's Leases say at one moment.
type leaseView struct {
	// members are the live members whose shard count is the ring's.
	members []string
	// shardCount is the ring's shard count: the one most live members
	// announce (ties: the oldest member's), 0 with no live member.
	shardCount int32
	// shards holds each shard's Lease record, when it exists.
	shards map[int32]*shardLease
	// expiries are the times at which a live Lease will expire.
	expiries []time.Time
	total    int32
	// invalid says, per live member Lease whose AnnotationShards is not a
	// shard count, why: such a member is no member of the ring.
	invalid []error
}

// memberShardCount reads the shard count a member Lease announces.
func (k labelKeys) memberShardCount(l *coordinationv1.Lease) (int32, error) {
	v := l.Annotations[k.shards]
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 1 || n > maxShards {
		return 0, fmt.Errorf("member Lease %s: annotation %s %q is not a shard count in [1, %d]", l.Name, k.shards, v, maxShards)
	}
	return int32(n), nil
}

// shardLease is the part of a shard Lease that claims depend on.
type shardLease struct {
	holder string
	expiry time.Time
}

func (v *leaseView) unowned() int {
	n := 0
	for s := range v.total {
		if l, ok := v.shards[s]; !ok || l.holder == "" || !l.live(time.Now()) {
			n++
		}
	}
	return n
}

func (l *shardLease) live(now time.Time) bool { return l.holder != "" && now.Before(l.expiry) }

// state judges the shard Lease for the process holding Leases as me; nil is
// a Lease that does not exist.
func (l *shardLease) state(me string, now time.Time) leaseState {
	if l == nil {
		return stateOf(false, "", me, time.Time{}, now)
	}
	return stateOf(true, l.holder, me, l.expiry, now)
}

func leaseExpiry(spec coordinationv1.LeaseSpec) time.Time {
	if spec.RenewTime == nil || spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return spec.RenewTime.Add(time.Duration(*spec.LeaseDurationSeconds) * time.Second)
}

// readLeases builds the view from the Leases of a ring; expiryOf says when
// each Lease expires (a replica: from its own observations; kshard status:
// from the written renew time).
func readLeases(keys labelKeys, ring string, items []coordinationv1.Lease, shards int32, now time.Time, expiryOf func(*coordinationv1.Lease) time.Time) *leaseView {
	v := &leaseView{shards: map[int32]*shardLease{}, total: shards}
	type live struct {
		name    string
		shards  int32
		created time.Time
	}
	var members []live
	for i := range items {
		l := &items[i]
		expiry := expiryOf(l)
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		if expiry.After(now) && holder != "" {
			v.expiries = append(v.expiries, expiry)
		}
		switch l.Labels[keys.leaseKind] {
		case LeaseKindMember:
			if holder == "" || !expiry.After(now) {
				continue
			}
			n, err := keys.memberShardCount(l)
			if err != nil {
				v.invalid = append(v.invalid, err)
				continue
			}
			members = append(members, live{name: HolderReplica(holder), shards: n, created: l.CreationTimestamp.Time})
		case LeaseKindShard:
			n, ok := ParseShardLeaseName(ring, l.Name, shards)
			if !ok {
				continue
			}
			v.shards[n] = &shardLease{holder: holder, expiry: expiry}
		}
	}
	if len(members) == 0 {
		return v
	}
	sort.Slice(members, func(i, j int) bool {
		if !members[i].created.Equal(members[j].created) {
			return members[i].created.Before(members[j].created)
		}
		return members[i].name < members[j].name
	})
	votes := map[int32]int{}
	for _, m := range members {
		votes[m.shards]++
	}
	best := members[0].shards // the oldest member breaks ties
	for count, n := range votes {
		if n > votes[best] {
			best = count
		}
	}
	v.shardCount = best
	for _, m := range members {
		if m.shards == best {
			v.members = append(v.members, m.name)
		}
	}
	return v
}
