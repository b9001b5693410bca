// Package ring is a ring's model as pure functions: which live member
// should run each shard (Ring), what the ring's Leases say at one moment
// (Read), and the ring as the cluster shows it (ReadStatus). The replicas
// (package sharding) act on it; tools that look at a ring from outside (a
// status command, a load tester predicting owners) read it without the
// runtime.
package ring

import (
	"fmt"
	"sort"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// Ring settings. With 64 shards and 3 to 10 members they keep the busiest
// member at or below 1.25 times the mean (TestRingBalance checks every count):
// Load caps each member at ceil(mean × Load) shards, and the many virtual
// nodes spread the rest. Load above 1 also guarantees buraksezer/consistent
// always finds room, so its "not enough room" panic cannot happen.
const (
	ringReplicationFactor = 200
	ringLoad              = 1.1
)

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

// New computes the owners of shards [0, shards) among members.
func New(shards int32, members []string) *Ring {
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
