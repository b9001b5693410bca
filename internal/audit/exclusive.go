package audit

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kshard/kshard/internal/shardwrites"
	"github.com/kshard/kshard/sharding/lease"
)

// ShardWriteResources are the resources a shard's holder writes, and only
// it: the ConfigMaps it renders, its bindings' status, the domain mirrors,
// and a binding's labels, which the labeler stamps and a holder removes
// (a wrong one).
var ShardWriteResources = []string{"configmaps", "configbindings", "configbindings/status", "externaldomains", "externaldomains/status"}

// FencingPolicy prefixes the name of the admission policy that refuses a
// write by a replica that does not hold the shard's Lease (deploy/base).
const FencingPolicy = shardwrites.Policy

// CheckOptions say which Leases grant which shards.
type CheckOptions struct {
	// Ring names the ring; its shard Leases are <Ring>-shard-<n>. Required.
	Ring string
	// LeaseNamespace holds the ring's Leases. Required.
	LeaseNamespace string
	// ShardTable names the ring's shard table, a ConfigMap in
	// LeaseNamespace that the labeler writes (sharding's
	// Options.ShardTable): its writes belong to no shard, and are checked
	// against the labeler Lease. Empty: the ring keeps none.
	ShardTable string
	// Namespaces, when set, limit the check to objects in them: for a
	// control plane that other rings share. Cluster-scoped objects
	// (ExternalDomains) are checked only if "" is among them.
	Namespaces []string
	// ReplicaUsers are the users the replicas authenticate as. A write to a
	// shard resource by one of them whose user agent names no holder is
	// Unattributed: the check cannot tell whether it was in a tenure, so
	// it fails. Empty: writers are told apart by their user agent only.
	ReplicaUsers []string
}

// Exclusivity is what the API server's audit log says of the replicas'
// writes to shard resources.
type Exclusivity struct {
	// Committed counts the replicas' writes the API server committed (2xx),
	// by resource.
	Committed map[string]int
	// Refused are the replicas' writes the fencing admission policy denied:
	// each one a write the Lease forbade, stopped by the API server.
	Refused []Write
	// Stray are committed writes by a replica that did not hold, at the
	// write's resourceVersion, the Lease of every shard the write touched:
	// the object's shard before the write (its label as last committed) and
	// after it (as returned); its identity (replica and incarnation) was
	// not the holder the Lease had been last written with before the write
	// was committed. A shard label stamped on a ConfigBinding, and a write
	// of the shard table, are the labeler's, checked against the labeler
	// Lease instead.
	Stray []Write
	// Unattributed are writes to shard resources by a ReplicaUsers user
	// whose user agent names no holder.
	Unattributed []Write
	// LeaseWrites counts the committed writes of the ring's shard Leases
	// and of its labeler Lease.
	LeaseWrites int
}

// OK reports whether every committed write of a replica was inside its
// tenure and attributed.
func (e *Exclusivity) OK() bool { return len(e.Stray) == 0 && len(e.Unattributed) == 0 }

// Writes is the number of committed replica writes to shard resources.
func (e *Exclusivity) Writes() int {
	n := 0
	for _, c := range e.Committed {
		n += c
	}
	return n
}

func (e *Exclusivity) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d committed replica writes to shard resources (%v), %d shard Lease writes, %d refused by %s, %d outside a tenure, %d unattributed",
		e.Writes(), e.Committed, e.LeaseWrites, len(e.Refused), FencingPolicy, len(e.Stray), len(e.Unattributed))
	for i, w := range e.Stray {
		if i == 10 {
			fmt.Fprintf(&b, "\n  … %d more outside a tenure", len(e.Stray)-i)
			break
		}
		fmt.Fprintf(&b, "\n  outside a tenure: %s", w)
	}
	for i, w := range e.Unattributed {
		if i == 10 {
			fmt.Fprintf(&b, "\n  … %d more unattributed", len(e.Unattributed)-i)
			break
		}
		fmt.Fprintf(&b, "\n  unattributed: %s", w)
	}
	return b.String()
}

// leaseCommit is one committed write of a shard Lease.
type leaseCommit struct {
	version uint64
	holder  string
}

// labelerLease keys the labeler Lease's commits among the shards'.
const labelerLease = int32(-2)

// objectKey names one object of one resource, the subresource aside.
func objectKey(w Write) string {
	res, _, _ := strings.Cut(w.Resource, "/")
	return res + "/" + w.Namespace + "/" + w.Name
}

// labelCommit is an object's shard label as one commit left it.
type labelCommit struct {
	version uint64
	shard   int32
}

// CheckExclusive checks every write the API server committed to a shard
// resource against the Leases of the shards it touched, at that moment, in
// the API server's own order: etcd revisions, which every committed object
// carries as its resourceVersion and which are one sequence for all
// resources. A write at revision v by holder h touched the shard its object
// was in before it (the label the object's last commit before v left, by
// whomever) and the one it is in after it (the label returned); it is in h's
// tenure when, for each of them, the last commit of the shard's Lease
// before v named exactly h, replica and incarnation. A shard label stamped
// on a ConfigBinding and a write of the shard table are in h's tenure when
// h held the labeler Lease. A write that changed nothing returns the
// revision of an earlier commit; it is excused when some writer of that same
// revision was entitled to it (the commit was someone's legitimate write),
// and a stray otherwise.
func CheckExclusive(l *APILog, opts CheckOptions) *Exclusivity {
	e := &Exclusivity{Committed: map[string]int{}}
	shardRes := map[string]bool{}
	for _, r := range ShardWriteResources {
		shardRes[r] = true
	}
	inScope := map[string]bool{}
	for _, ns := range opts.Namespaces {
		inScope[ns] = true
	}
	replicaUser := map[string]bool{}
	for _, u := range opts.ReplicaUsers {
		replicaUser[u] = true
	}
	labeler := lease.LabelerName(opts.Ring)
	isTable := func(w Write) bool {
		return opts.ShardTable != "" && w.Resource == "configmaps" && w.Namespace == opts.LeaseNamespace && w.Name == opts.ShardTable
	}
	leases := map[int32][]leaseCommit{}
	// writers of each committed (object, resourceVersion): who may have
	// made that commit. A non-replica writer is "".
	writers := map[string]map[uint64][]string{}
	// labels: each object's shard label, commit by commit.
	labels := map[string][]labelCommit{}
	var candidates []Write
	for _, w := range l.Writes {
		if w.Resource == "leases" && w.Namespace == opts.LeaseNamespace {
			n, ok := parseShardLease(opts.Ring, w.Name)
			if w.Name == labeler {
				n, ok = labelerLease, true
			}
			if ok && w.committed() && w.Version > 0 {
				leases[n] = append(leases[n], leaseCommit{version: w.Version, holder: w.LeaseHolder})
				e.LeaseWrites++
			}
			continue
		}
		if !shardRes[w.Resource] || (len(opts.Namespaces) > 0 && !inScope[w.Namespace] && !isTable(w)) {
			continue
		}
		if w.committed() && w.Version > 0 {
			k := objectKey(w)
			if writers[k] == nil {
				writers[k] = map[uint64][]string{}
			}
			writers[k][w.Version] = append(writers[k][w.Version], w.Holder)
			labels[k] = append(labels[k], labelCommit{version: w.Version, shard: w.Shard})
		}
		if w.Holder == "" && replicaUser[w.Username] {
			e.Unattributed = append(e.Unattributed, w)
			continue
		}
		if w.Holder == "" {
			continue
		}
		switch {
		case w.committed():
			e.Committed[w.Resource]++
			candidates = append(candidates, w)
		case w.Code == 403 && (strings.Contains(w.Message, "kshard fencing") || strings.Contains(w.Message, FencingPolicy)):
			e.Refused = append(e.Refused, w)
		}
	}
	for _, hist := range leases {
		sort.Slice(hist, func(i, j int) bool { return hist[i].version < hist[j].version })
	}
	for _, hist := range labels {
		sort.SliceStable(hist, func(i, j int) bool { return hist[i].version < hist[j].version })
	}
	holderAt := func(shard int32, v uint64) string {
		hist := leases[shard]
		i := sort.Search(len(hist), func(i int) bool { return hist[i].version >= v })
		if i == 0 {
			return ""
		}
		return hist[i-1].holder
	}
	// before is an object's shard label before the commit at v: -1 with
	// none, or none known.
	before := func(w Write) int32 {
		hist := labels[objectKey(w)]
		i := sort.Search(len(hist), func(i int) bool { return hist[i].version >= w.Version })
		if i == 0 {
			return -1
		}
		return hist[i-1].shard
	}
	// entitled says whether holder h was entitled to write w.
	entitled := func(h string, w Write) bool {
		if isTable(w) || (w.Resource == "configbindings" && w.Shard >= 0) {
			return holderAt(labelerLease, w.Version) == h
		}
		touched := 0
		for _, s := range []int32{before(w), w.Shard} {
			if s < 0 {
				continue
			}
			touched++
			if holderAt(s, w.Version) != h {
				return false
			}
		}
		return touched > 0
	}
	for _, w := range candidates {
		if w.Version == 0 || (w.Shard < 0 && before(w) < 0 && !isTable(w)) {
			// A committed write that returned no object, or an object
			// that was and is in no shard: nothing orders it against the
			// Leases.
			e.Unattributed = append(e.Unattributed, w)
			continue
		}
		if entitled(w.Holder, w) {
			continue
		}
		excused := false
		for _, h := range writers[objectKey(w)][w.Version] {
			if h != w.Holder && (h == "" || entitled(h, w)) {
				excused = true
				break
			}
		}
		if !excused {
			e.Stray = append(e.Stray, w)
		}
	}
	sort.Slice(e.Stray, func(i, j int) bool { return e.Stray[i].Version < e.Stray[j].Version })
	return e
}

func parseShardLease(ring, name string) (int32, bool) {
	return lease.ParseShardName(ring, name, 1<<20)
}
