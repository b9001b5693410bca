// Package shardwrites writes the part of the admission fence that depends on
// a ring's shard count (deploy/base/shard-fence.yaml): one binding of
// deploy/base's kshard-shard-writes policy per shard, selecting the objects
// labelled with that shard before or after a write and taking that shard's
// Lease as its param, so that the API server checks a write against one Lease
// per shard it touches; the shard Leases themselves, held by nobody until a
// replica takes one; and the kshard-shard-labels policy, which refuses a
// replica's write that leaves an object in no shard of the ring. `kshard
// fencing` prints them for deploy/base, and the load tester binds them for
// the shard count of its run: both from here, so that a ring of any size is
// fenced shard by shard.
package shardwrites

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding/lease"
	ringkeys "github.com/kshard/kshard/sharding/ring"
)

// Policy is the ValidatingAdmissionPolicy of deploy/base that the bindings
// bind: a replica may write an object that is or was in a shard only while
// its pod holds the shard's Lease.
const Policy = "kshard-shard-writes"

// LabelsPolicy is the ValidatingAdmissionPolicy that refuses a replica's
// write leaving an object without a shard label of the ring: with none,
// every per-shard binding would pass it by, and the write would be checked
// against no Lease.
const LabelsPolicy = "kshard-shard-labels"

// ServiceAccount is the replicas' ServiceAccount in the Lease namespace
// (deploy/base/serviceaccount.yaml).
const ServiceAccount = "kshard"

// Bindings are the bindings of Policy for every shard of a ring whose Leases
// live in leaseNamespace and whose objects carry the shard label under
// labelPrefix (sharding.Options.LabelPrefix). A shard whose Lease does not
// exist fails a write closed (parameterNotFoundAction Deny), for every user:
// the API server resolves a binding's param before the policy's match
// conditions. So the Leases ship with the bindings (Leases), and the
// replicas may not delete them.
func Bindings(ring, leaseNamespace, labelPrefix string, shards int32) []admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	out := make([]admissionregistrationv1.ValidatingAdmissionPolicyBinding, 0, shards)
	for n := range shards {
		out = append(out, admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", Policy, n)},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        Policy,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
				ParamRef: &admissionregistrationv1.ParamRef{
					Name:                    lease.ShardName(ring, n),
					Namespace:               leaseNamespace,
					ParameterNotFoundAction: ptr.To(admissionregistrationv1.DenyAction),
				},
				MatchResources: &admissionregistrationv1.MatchResources{
					ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{ringkeys.KeysFor(labelPrefix).Shard: fmt.Sprint(n)}},
				},
			},
		})
	}
	return out
}

// Leases are the shard Leases of a ring as Bindings name them, held by
// nobody, labelled as the replicas label the ones they create (so that the
// ring's Lease watch sees them). Shipped with the bindings, they exist
// before any replica runs: without them a binding's missing param would
// refuse everyone's writes to the shard's objects, an administrator's
// too, until a replica first took the shard. They carry no spec, so
// applying them again never touches the holder a replica wrote.
func Leases(ring, leaseNamespace, labelPrefix string, shards int32) []coordinationv1.Lease {
	keys := ringkeys.KeysFor(labelPrefix)
	out := make([]coordinationv1.Lease, 0, shards)
	for n := range shards {
		out = append(out, coordinationv1.Lease{
			TypeMeta: metav1.TypeMeta{APIVersion: coordinationv1.SchemeGroupVersion.String(), Kind: "Lease"},
			ObjectMeta: metav1.ObjectMeta{Name: lease.ShardName(ring, n), Namespace: leaseNamespace,
				Labels: map[string]string{keys.Ring: ring, keys.LeaseKind: lease.KindShard}},
		})
	}
	return out
}

// Labels is LabelsPolicy for a ring of shards shards whose replicas run as
// ServiceAccount in leaseNamespace, whose labeler keeps shardTable there,
// and whose shard label is under labelPrefix, and its binding. A write passes it if it leaves the object's shard label
// a shard of the ring (canonical: "7", not "07"), or removes the label and,
// by the policies on each kind, nothing else (a holder handing an object to
// its rightful shard).
func Labels(leaseNamespace, shardTable, labelPrefix string, shards int32) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	shardLabel := ringkeys.KeysFor(labelPrefix).Shard
	label := fmt.Sprintf("'%s'", shardLabel)
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: LabelsPolicy},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{
				writes("", "configmaps"),
				writes("config.kshard.dev", "configbindings", "configbindings/status", "externaldomains", "externaldomains/status"),
			}},
			MatchConditions: []admissionregistrationv1.MatchCondition{
				{Name: "kshard-replicas", Expression: fmt.Sprintf("request.userInfo.username == 'system:serviceaccount:%s:%s'", leaseNamespace, ServiceAccount)},
				{Name: "not-the-shard-table", Expression: fmt.Sprintf(
					"!(request.resource.resource == 'configmaps' && request.namespace == '%s' && request.name == '%s')", leaseNamespace, shardTable)},
			},
			Variables: []admissionregistrationv1.Variable{
				{Name: "shard", Expression: fmt.Sprintf("has(object.metadata.labels) && %[1]s in object.metadata.labels ? object.metadata.labels[%[1]s] : ''", label)},
				{Name: "removed", Expression: fmt.Sprintf(
					"request.operation == 'UPDATE' && variables.shard == '' && has(oldObject.metadata.labels) && %s in oldObject.metadata.labels", label)},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: fmt.Sprintf("variables.removed || (variables.shard.matches('^(0|[1-9][0-9]{0,3})$') && int(variables.shard) < %d)", shards),
				MessageExpression: fmt.Sprintf("'kshard fencing: a replica leaves every object it writes in one of the ring\\'s %d shards (label %s in [0, %d)); ' + "+
					"request.resource.resource + ' ' + request.name + ' would have ' + (variables.shard == '' ? 'none' : variables.shard)", shards, shardLabel, shards),
				Reason: ptr.To(metav1.StatusReasonForbidden),
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: LabelsPolicy},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        LabelsPolicy,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	return policy, binding
}

// writes matches the creates and updates of resources in group: the
// writes that leave an object behind.
func writes(group string, resources ...string) admissionregistrationv1.NamedRuleWithOperations {
	return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: resources},
	}}
}
