package shardwrites

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Fence is the ring's whole admission fence, in the order to apply it: the
// policies that check a write against a Lease, with their bindings; the
// shard Leases, before the per-shard bindings that take them as params (a
// binding whose Lease is missing refuses everyone's writes to its shard);
// the per-shard bindings; the shard-labels policy; and, with a shard table,
// the policy that labels a For object at its creation; with ImmutableDomain,
// the policy that keeps a domain label as it was.
func (r Ring) Fence() []client.Object {
	var out []client.Object
	out = append(out, r.shardWritesPolicy())
	labeler, labelerBinding := r.labelerWrites()
	out = append(out, labeler, labelerBinding)
	if r.LabelsOnly {
		forWrites, forBinding := r.forWrites()
		out = append(out, forWrites, forBinding)
	}
	deletes, deletesBinding := r.leaseDeletes()
	out = append(out, deletes, deletesBinding)
	for _, l := range r.Leases() {
		out = append(out, &l)
	}
	for _, b := range r.Bindings() {
		out = append(out, &b)
	}
	labels, labelsBinding := r.Labels()
	out = append(out, labels, labelsBinding)
	if r.ShardTable != "" {
		label, labelBinding := r.ShardLabel()
		out = append(out, label, labelBinding)
	}
	if r.ImmutableDomain {
		domain, domainBinding := r.immutableDomain()
		out = append(out, domain, domainBinding)
	}
	return out
}
