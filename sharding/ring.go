package sharding

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding/lease"
)

// The ring, as pure functions of what its Leases say: which shard a domain
// is in (ShardOf), who should own each shard (Ring), and what the ring's
// Leases say at one moment (readLeases, its leaseView). The runtime
// (replica.go, shard.go) acts on them; ReadStatus (status.go) prints them.

// Ring settings. With 64 shards and 3 to 10 members they keep the busiest
// member at or below 1.25 times the mean (TestRingBalance checks every count):
// Load caps each member at ceil(mean × Load) shards, and the many virtual
// nodes spread the rest. Load above 1 also guarantees buraksezer/consistent
// always finds room, so its "not enough room" panic cannot happen.
const (
	ringReplicationFactor = 200
	ringLoad              = 1.1
)

// ShardOf is the shard of a business domain: stable for a given shard count,
// whatever the members, so scaling never relabels objects. It equals
// buraksezer/consistent's FindPartitionID with the xxhash hasher.
func ShardOf(domain string, shards int32) int32 {
	return int32(xxhash.Sum64String(domain) % uint64(shards))
}

type member string

func (m member) String() string { return string(m) }

type hasher struct{}

func (hasher) Sum64(data []byte) uint64 { return xxhash.Sum64(data) }

// Ring maps shards to the live members that should run them, by consistent
// hashing with bounded loads: a membership change moves few shards, and no
// member gets much more than its share. Every replica builds the same Ring
// from the same member Leases, so they agree on owners without talking.
type Ring struct {
	shards  int32
	members []string
	owners  []string
}

// NewRing computes the owners of shards [0, shards) among members.
func NewRing(shards int32, members []string) *Ring {
	r := &Ring{shards: shards, members: append([]string(nil), members...)}
	sort.Strings(r.members)
	r.owners = make([]string, shards)
	if len(r.members) == 0 {
		return r
	}
	ms := make([]consistent.Member, 0, len(r.members))
	for _, m := range r.members {
		ms = append(ms, member(m))
	}
	c := consistent.New(ms, consistent.Config{
		PartitionCount:    int(shards),
		ReplicationFactor: ringReplicationFactor,
		Load:              ringLoad,
		Hasher:            hasher{},
	})
	for s := range shards {
		r.owners[s] = c.GetPartitionOwner(int(s)).String()
	}
	return r
}

// Shards is the ring's shard count.
func (r *Ring) Shards() int32 { return r.shards }

// Members are the ring's members, sorted.
func (r *Ring) Members() []string { return r.members }

// Owner is the member that should run a shard, or "" when the ring is empty.
func (r *Ring) Owner(shard int32) string {
	if shard < 0 || shard >= r.shards {
		panic(fmt.Sprintf("shard %d out of range [0, %d)", shard, r.shards))
	}
	return r.owners[shard]
}

// ShardsOf lists the shards a member should run.
func (r *Ring) ShardsOf(m string) []int32 {
	var out []int32
	for s, o := range r.owners {
		if o == m {
			out = append(out, int32(s))
		}
	}
	return out
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
func (l *shardLease) state(me string, now time.Time) lease.State {
	if l == nil {
		return lease.StateOf(false, "", me, time.Time{}, now)
	}
	return lease.StateOf(true, l.holder, me, l.expiry, now)
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
		case lease.KindMember:
			if holder == "" || !expiry.After(now) {
				continue
			}
			n, err := keys.memberShardCount(l)
			if err != nil {
				v.invalid = append(v.invalid, err)
				continue
			}
			members = append(members, live{name: lease.HolderReplica(holder), shards: n, created: l.CreationTimestamp.Time})
		case lease.KindShard:
			n, ok := lease.ParseShardName(ring, l.Name, shards)
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
