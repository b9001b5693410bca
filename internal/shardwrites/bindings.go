// Package shardwrites writes the admission policy bindings that fence a
// ring's shard writes: one binding of deploy/base's kshard-shard-writes
// policy per shard, selecting the objects labelled with that shard and taking that
// shard's Lease as its param, so that the API server checks a write against
// one Lease. `kshard fencing` prints them for deploy/base, and the load
// tester binds them for the shard count of its run: both from here, so that
// a ring of any size is fenced shard by shard.
package shardwrites

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// Policy is the ValidatingAdmissionPolicy of deploy/base that the bindings
// bind: a replica may write a shard's objects only while its pod holds the
// shard's Lease.
const Policy = "kshard-shard-writes"

// Bindings are the bindings of Policy for every shard of a ring whose Leases
// live in leaseNamespace. A shard with no Lease yet is held by nobody, so no
// replica writes it: its binding allows the write.
func Bindings(ring, leaseNamespace string, shards int32) []admissionregistrationv1.ValidatingAdmissionPolicyBinding {
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
					ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction),
				},
				MatchResources: &admissionregistrationv1.MatchResources{
					ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{sharding.LabelShard: fmt.Sprint(n)}},
				},
			},
		})
	}
	return out
}
