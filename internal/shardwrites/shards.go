// Package shardwrites writes a ring's admission fence: the policies with
// which the API server itself refuses a replica's write to a shard whose
// Lease its pod does not hold, however late the write arrives and whoever
// holds the replica's token. For kshard's own ring (DefaultRing) it is
// deploy/base/shard-fence.yaml; for a controller that embeds the sharding
// library, `kshard fencing` with its ring's names, kind and written
// resources. Per shard, one binding of the ring's shard-writes policy,
// selecting the objects labelled with that shard before or after a write
// and taking that shard's Lease as its param, so that the API server checks
// a write against one Lease per shard it touches; the shard Leases
// themselves, held by nobody until a replica takes one; and the policies
// that keep a replica's relabels, deletes and For-object writes inside its
// tenure (docs/security.md lists them). The load tester binds the same
// fence for its run's namespace and shard count.
package shardwrites

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding/lease"
)

// Policy is the ValidatingAdmissionPolicy of kshard's ring that the
// per-shard bindings bind: a replica may write an object that is or was in
// a shard only while its pod holds the shard's Lease.
const Policy = "kshard-" + policyShardWrites

// LabelsPolicy is the ValidatingAdmissionPolicy of kshard's ring that
// refuses a replica's write leaving an object without a shard label of the
// ring: with none, every per-shard binding would pass it by, and the write
// would be checked against no Lease.
const LabelsPolicy = "kshard-" + policyShardLabels

// Bindings are the bindings of the ring's shard-writes policy, one per
// shard, each selecting the objects labelled with its shard before or
// after a write and taking that shard's Lease as its param. A shard whose
// Lease does not exist fails a write closed (parameterNotFoundAction
// Deny), for every user: the API server resolves a binding's param before
// the policy's match conditions. So the Leases ship with the bindings
// (Leases), and the replicas may not delete them.
func (r Ring) Bindings() []admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	out := make([]admissionregistrationv1.ValidatingAdmissionPolicyBinding, 0, r.Shards)
	for n := range r.Shards {
		b := r.binding(policyShardWrites, &admissionregistrationv1.ParamRef{
			Name:                    lease.ShardName(r.Name, n),
			Namespace:               r.Namespace,
			ParameterNotFoundAction: ptr.To(admissionregistrationv1.DenyAction),
		})
		b.Name = fmt.Sprintf("%s-%d", r.policy(policyShardWrites), n)
		b.Spec.MatchResources = &admissionregistrationv1.MatchResources{
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{r.keys().Shard: fmt.Sprint(n)}},
		}
		out = append(out, *b)
	}
	return out
}

// Leases are the ring's shard Leases as Bindings name them, held by
// nobody, labelled as the replicas label the ones they create (so that the
// ring's Lease watch sees them). Shipped with the bindings, they exist
// before any replica runs: without them a binding's missing param would
// refuse everyone's writes to the shard's objects, an administrator's
// too, until a replica first took the shard. They carry no spec, so
// applying them again never touches the holder a replica wrote.
func (r Ring) Leases() []coordinationv1.Lease {
	keys := r.keys()
	out := make([]coordinationv1.Lease, 0, r.Shards)
	for n := range r.Shards {
		out = append(out, coordinationv1.Lease{
			TypeMeta: metav1.TypeMeta{APIVersion: coordinationv1.SchemeGroupVersion.String(), Kind: "Lease"},
			ObjectMeta: metav1.ObjectMeta{Name: lease.ShardName(r.Name, n), Namespace: r.Namespace,
				Labels: map[string]string{keys.Ring: r.Name, keys.LeaseKind: lease.KindShard}},
		})
	}
	return out
}

// Labels is the ring's shard-labels policy and its binding. A write passes
// it if it leaves the object's shard label a shard of the ring (canonical:
// "7", not "07"), or removes the label and, by the policies on each kind,
// nothing else (a holder handing an object to its rightful shard).
func (r Ring) Labels() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	shardLabel := r.keys().Shard
	label := celString(shardLabel)
	conds := []admissionregistrationv1.MatchCondition{r.replicas()}
	if r.ShardTable != "" {
		conds = append(conds, admissionregistrationv1.MatchCondition{Name: "not-the-shard-table", Expression: fmt.Sprintf(
			"!(request.resource.resource == 'configmaps' && request.namespace == %s && request.name == %s)", celString(r.Namespace), celString(r.ShardTable))})
	}
	policy := validatingPolicy(r.policy(policyShardLabels), admissionregistrationv1.ValidatingAdmissionPolicySpec{
		FailurePolicy: ptr.To(admissionregistrationv1.Fail),
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: rules(
			[]admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update}, append(r.Writes, r.For)...)},
		MatchConditions: conds,
		Variables: []admissionregistrationv1.Variable{
			{Name: "shard", Expression: fmt.Sprintf("has(object.metadata.labels) && %[1]s in object.metadata.labels ? object.metadata.labels[%[1]s] : ''", label)},
			{Name: "removed", Expression: fmt.Sprintf(
				"request.operation == 'UPDATE' && variables.shard == '' && has(oldObject.metadata.labels) && %s in oldObject.metadata.labels", label)},
		},
		Validations: []admissionregistrationv1.Validation{{
			Expression: fmt.Sprintf("variables.removed || (variables.shard.matches('^(0|[1-9][0-9]{0,3})$') && int(variables.shard) < %d)", r.Shards),
			MessageExpression: fmt.Sprintf("'kshard fencing: a replica leaves every object it writes in one of the ring\\'s %d shards (label %s in [0, %d)); ' + "+
				"request.resource.resource + ' ' + request.name + ' would have ' + (variables.shard == '' ? 'none' : variables.shard)", r.Shards, shardLabel, r.Shards),
			Reason: ptr.To(metav1.StatusReasonForbidden),
		}},
	})
	return policy, r.binding(policyShardLabels, nil)
}
