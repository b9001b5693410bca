// Package lease is the vocabulary of the Leases a ring coordinates through
// (each replica's member Lease, one Lease per shard, the labeler's): their
// names, the holder identities written into them, and the one verdict on
// whether a process may take one. It is apart from sharding so that the
// tools that read a ring from outside (a status command, a dashboard's
// queries, a load tester's checks) name its Leases exactly as the replicas
// do, without the runtime that writes them.
package lease

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Values of the ring's lease-kind label: a member Lease says a replica is
// alive and which shard count it runs; a shard Lease says which replica
// runs the shard.
const (
	KindMember = "member"
	KindShard  = "shard"
)

// ShardName is the name of the Lease that one replica must hold to run a
// shard of a ring. Names carry the ring, so rings can share a namespace:
// with the ring "kshard" they are kshard-shard-<n>.
func ShardName(ring string, shard int32) string { return fmt.Sprintf("%s-shard-%d", ring, shard) }

// MemberName is the name of a replica's member Lease in a ring:
// <ring>-member-<replica>.
func MemberName(ring, replica string) string { return ring + "-member-" + replica }

// LabelerName is the name of the Lease whose holder labels the ring's
// unlabeled objects.
func LabelerName(ring string) string { return ring + "-labeler" }

// ParseShardName is the inverse of ShardName: the shard, in [0, shards),
// that a Lease of the ring is for.
func ParseShardName(ring, name string, shards int32) (int32, bool) {
	v, ok := strings.CutPrefix(name, ring+"-shard-")
	if !ok {
		return 0, false
	}
	return ParseShard(v, shards)
}

// ParseShard reads a shard number as a ring writes it, in a Lease's name
// and in an object's shard label (strconv.Itoa: no sign, no leading zero),
// and reports whether it is one in [0, shards).
func ParseShard(v string, shards int32) (int32, bool) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n < 0 || n >= int64(shards) || strconv.FormatInt(n, 10) != v {
		return 0, false
	}
	return int32(n), true
}

// ParseMemberName is the inverse of MemberName.
func ParseMemberName(ring, name string) (string, bool) {
	replica, ok := strings.CutPrefix(name, ring+"-member-")
	return replica, ok && replica != ""
}

// Holder is the name a process holds Leases under: its replica identity
// and its incarnation, "<identity>_<incarnation>".
func Holder(identity, incarnation string) string { return identity + "_" + incarnation }

// HolderReplica returns the replica a Lease's holder identity names. A
// replica holds Leases as "<replica>_<incarnation>", with an incarnation
// drawn once per process, so two processes started with one identity (a
// duplicated --replica-id, a pod force-deleted during a partition) never
// take each other's Leases for their own. A holder without an incarnation
// is the replica itself: a member Lease kept, by a replica restarting in a
// StatefulSet, for its next incarnation.
func HolderReplica(holder string) string {
	replica, _, _ := strings.Cut(holder, "_")
	return replica
}

// NewIncarnation draws an incarnation: eight hex digits, fresh per process,
// so a restarted replica never takes its predecessor's Leases for its own.
func NewIncarnation() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// State is what a Lease is to the process that reads it.
type State int

const (
	// Absent: the Lease does not exist; whoever creates it holds it.
	Absent State = iota
	// Free: nobody holds it (it was released), or it is kept for this
	// replica's next incarnation (its holder names the replica alone).
	Free
	// Ours: this incarnation holds it.
	Ours
	// Held: another holder, seen renewing it within its duration.
	Held
	// Expired: another holder, not seen renewing it for its duration.
	Expired
)

func (st State) String() string {
	return [...]string{"Absent", "Free", "Ours", "Held", "Expired"}[st]
}

// StateOf judges a Lease for the process holding Leases as me: exists says
// whether it exists, holder is its holder identity, and expiry when it
// expires by the reader's observations (a replica times it on its own
// monotonic clock; a status command may read the written renew time). It
// is the only place that decides who may take a Lease.
func StateOf(exists bool, holder, me string, expiry, now time.Time) State {
	switch {
	case !exists:
		return Absent
	case holder == me:
		return Ours
	case holder == "" || holder == HolderReplica(me):
		return Free
	case now.Before(expiry):
		return Held
	}
	return Expired
}

// Takeable says whether a Lease in this state may be taken, and why, in the
// words of the handover metric's reason label.
func (st State) Takeable() (reason string, ok bool) {
	switch st {
	case Absent:
		return "created", true
	case Free:
		return "released", true
	case Ours:
		return "reclaimed", true
	case Expired:
		return "expired", true
	}
	return "", false
}
