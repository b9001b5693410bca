package ring

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding/lease"
)

// MaxShards is the largest shard count of a ring: a replica holds a Lease,
// and renews it every retry period, for each shard it runs.
const MaxShards = 4096

// Keys are a ring's label and annotation keys under one prefix (sharding's
// Options.LabelPrefix).
type Keys struct {
	// Shard labels an object with its shard number, Domain with the
	// business domain the shard was computed from.
	Shard, Domain string
	// Ring labels the ring's Leases, LeaseKind tells member from shard
	// Leases (lease.KindMember, lease.KindShard), and Shards annotates a
	// member Lease with the shard count its replica runs.
	Ring, LeaseKind, Shards string
	// Leaving annotates the member Lease of a replica about to leave the
	// ring, and WarmFor the member Lease of a replica that has synced a
	// cache of the shards it takes from the leaving members it names
	// (comma-separated): a warm leave.
	Leaving, WarmFor string
}

// KeysFor are the keys under prefix.
func KeysFor(prefix string) Keys {
	return Keys{Shard: prefix + "/shard", Domain: prefix + "/domain", Ring: prefix + "/ring",
		LeaseKind: prefix + "/lease-kind", Shards: prefix + "/shards",
		Leaving: prefix + "/leaving", WarmFor: prefix + "/warm-for"}
}

// ShardLabel returns the shard an object's labels name, and whether they
// name one in [0, shards).
func (k Keys) ShardLabel(labels map[string]string, shards int32) (int32, bool) {
	v, ok := labels[k.Shard]
	if !ok {
		return 0, false
	}
	return lease.ParseShard(v, shards)
}

// View is what a ring's Leases say at one moment.
type View struct {
	// Members are the live members whose shard count is the ring's.
	Members []string
	// ShardCount is the ring's shard count: the one most live members
	// announce (ties: the count whose oldest member is the oldest), 0 with
	// no live member.
	ShardCount int32
	// Shards holds each shard's Lease, when it exists.
	Shards map[int32]*ShardLease
	// Expiries are the times at which a live Lease will expire.
	Expiries []time.Time
	// Invalid says, per live member Lease whose shard-count annotation is
	// not a shard count, why: such a member is no member of the ring.
	Invalid []error
	// Leaving are the Members that announce they leave: they still hold
	// their shards, while the replicas that take them sync a cache of them,
	// but the ring is computed without them.
	Leaving []string
	// WarmFor says, per member, the leaving members whose shards it has a
	// synced cache of.
	WarmFor map[string][]string
	total   int32
}

// memberShardCount reads the shard count a member Lease announces.
func (k Keys) memberShardCount(l *coordinationv1.Lease) (int32, error) {
	v := l.Annotations[k.Shards]
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 1 || n > MaxShards {
		return 0, fmt.Errorf("member Lease %s: annotation %s %q is not a shard count in [1, %d]", l.Name, k.Shards, v, MaxShards)
	}
	return int32(n), nil
}

// ShardLease is the part of a shard Lease that claims depend on.
type ShardLease struct {
	// Holder is the holder identity written in the Lease ("" when free).
	Holder string
	// Expiry is when the Lease expires, as the reader times it.
	Expiry time.Time
}

// Unowned counts the shards with no live holder now: their objects are not
// being reconciled.
func (v *View) Unowned(now time.Time) int {
	n := 0
	for s := range v.total {
		if l, ok := v.Shards[s]; !ok || !l.Live(now) {
			n++
		}
	}
	return n
}

// Live reports whether the Lease has a holder that has not expired.
func (l *ShardLease) Live(now time.Time) bool { return l.Holder != "" && now.Before(l.Expiry) }

// State judges the shard Lease for the process holding Leases as me; nil is
// a Lease that does not exist.
func (l *ShardLease) State(me string, now time.Time) lease.State {
	if l == nil {
		return lease.StateOf(false, "", me, time.Time{}, now)
	}
	return lease.StateOf(true, l.Holder, me, l.Expiry, now)
}

func leaseExpiry(spec coordinationv1.LeaseSpec) time.Time {
	if spec.RenewTime == nil || spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return spec.RenewTime.Add(time.Duration(*spec.LeaseDurationSeconds) * time.Second)
}

// Read builds the view of a ring's Leases; expiryOf says when each Lease
// expires (a replica: from its own observations; ReadStatus: from the
// written renew time).
func Read(keys Keys, ring string, items []coordinationv1.Lease, shards int32, now time.Time, expiryOf func(*coordinationv1.Lease) time.Time) *View {
	v := &View{Shards: map[int32]*ShardLease{}, total: shards}
	type live struct {
		name    string
		shards  int32
		created time.Time
		leaving bool
		warmFor []string
	}
	var members []live
	for i := range items {
		l := &items[i]
		expiry := expiryOf(l)
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		if expiry.After(now) && holder != "" {
			v.Expiries = append(v.Expiries, expiry)
		}
		switch l.Labels[keys.LeaseKind] {
		case lease.KindMember:
			if holder == "" || !expiry.After(now) {
				continue
			}
			n, err := keys.memberShardCount(l)
			if err != nil {
				v.Invalid = append(v.Invalid, err)
				continue
			}
			m := live{name: lease.HolderReplica(holder), shards: n, created: l.CreationTimestamp.Time, leaving: l.Annotations[keys.Leaving] != ""}
			if w := l.Annotations[keys.WarmFor]; w != "" {
				m.warmFor = strings.Split(w, ",")
			}
			members = append(members, m)
		case lease.KindShard:
			n, ok := lease.ParseShardName(ring, l.Name, shards)
			if !ok {
				continue
			}
			v.Shards[n] = &ShardLease{Holder: holder, Expiry: expiry}
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
	// Members are oldest first, so a count is first met at its oldest
	// member: a count tied with the best so far never displaces it, and ties
	// go to the count whose oldest member is the oldest. (Ranging over the
	// votes map settled ties between counts other than the oldest member's
	// by map order, and replicas flipped in and out of the ring.)
	best := members[0].shards
	for _, m := range members {
		if votes[m.shards] > votes[best] {
			best = m.shards
		}
	}
	v.ShardCount = best
	for _, m := range members {
		if m.shards != best {
			continue
		}
		v.Members = append(v.Members, m.name)
		if m.leaving {
			v.Leaving = append(v.Leaving, m.name)
		}
		if len(m.warmFor) > 0 {
			if v.WarmFor == nil {
				v.WarmFor = map[string][]string{}
			}
			v.WarmFor[m.name] = m.warmFor
		}
	}
	return v
}
