package sharding

import (
	"context"
	"sort"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// memberLease keeps this replica's member Lease fresh. Its presence, not any
// shard Lease, is what puts a replica in the ring.
type memberLease struct {
	r     *Replica
	lease *coordinationv1.Lease
}

func newMemberLease(r *Replica) *memberLease { return &memberLease{r: r} }

func (m *memberLease) run(ctx context.Context) {
	m.renewOnce(ctx)
	t := time.NewTicker(m.r.opts.RetryPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.renewOnce(ctx)
		}
	}
}

// renewOnce creates or renews the member Lease. Conflicts re-read it.
func (m *memberLease) renewOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, m.r.opts.RenewDeadline)
	defer cancel()
	opts := m.r.opts
	leases := m.r.leases.CoordinationV1().Leases(opts.LeaseNamespace)
	for attempt := 0; attempt < 3; attempt++ {
		now := metav1.NewMicroTime(m.r.opts.Clock.Now())
		if m.lease == nil {
			got, err := leases.Get(ctx, MemberLeaseName(opts.Ring, opts.Identity), metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				created, err := leases.Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{
						Name:        MemberLeaseName(opts.Ring, opts.Identity),
						Namespace:   opts.LeaseNamespace,
						Labels:      map[string]string{LabelRing: opts.Ring, LabelLeaseKind: LeaseKindMember},
						Annotations: map[string]string{AnnotationShards: strconv.Itoa(int(opts.Shards))},
					},
					Spec: coordinationv1.LeaseSpec{
						HolderIdentity:       ptr.To(opts.Identity),
						LeaseDurationSeconds: ptr.To(int32(opts.LeaseDuration / time.Second)),
						AcquireTime:          &now,
						RenewTime:            &now,
					},
				}, metav1.CreateOptions{})
				if err == nil {
					m.lease = created
					return
				}
				if !apierrors.IsAlreadyExists(err) {
					m.r.log.Error(err, "Creating member Lease")
					return
				}
				continue
			case err != nil:
				m.r.log.Error(err, "Reading member Lease")
				return
			}
			m.lease = got
		}
		l := m.lease.DeepCopy()
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[LabelRing] = opts.Ring
		l.Labels[LabelLeaseKind] = LeaseKindMember
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnotationShards] = strconv.Itoa(int(opts.Shards))
		if ptr.Deref(l.Spec.HolderIdentity, "") != opts.Identity {
			l.Spec.AcquireTime = &now
		}
		l.Spec.HolderIdentity = ptr.To(opts.Identity)
		l.Spec.LeaseDurationSeconds = ptr.To(int32(opts.LeaseDuration / time.Second))
		l.Spec.RenewTime = &now
		updated, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			m.lease = updated
			return
		}
		m.lease = nil
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			m.r.log.Error(err, "Renewing member Lease")
			return
		}
	}
}

// delete removes the member Lease: the replica leaves the ring.
func (m *memberLease) delete(ctx context.Context) {
	err := m.r.leases.CoordinationV1().Leases(m.r.opts.LeaseNamespace).Delete(ctx, MemberLeaseName(m.r.opts.Ring, m.r.opts.Identity), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
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

func leaseExpiry(spec coordinationv1.LeaseSpec) time.Time {
	if spec.RenewTime == nil || spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return spec.RenewTime.Add(time.Duration(*spec.LeaseDurationSeconds) * time.Second)
}

// readLeases builds the view from the Leases of a ring; expiryOf says when
// each Lease expires (a replica: from its own observations; kshard status:
// from the written renew time).
func readLeases(ring string, items []coordinationv1.Lease, shards int32, now time.Time, expiryOf func(*coordinationv1.Lease) time.Time) *leaseView {
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
		switch l.Labels[LabelLeaseKind] {
		case LeaseKindMember:
			if holder == "" || !expiry.After(now) {
				continue
			}
			n, err := strconv.ParseInt(l.Annotations[AnnotationShards], 10, 32)
			if err != nil {
				continue
			}
			members = append(members, live{name: holder, shards: int32(n), created: l.CreationTimestamp.Time})
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
