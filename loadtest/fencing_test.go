package loadtest

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// TestFencingObjects: deploy/base's identity and RBAC build into the load
// tester's namespace, with the fence `kshard fencing` writes for the load
// tester's ring: the policy matches the renamed ServiceAccount's user, one binding per shard takes
// that shard's Lease of ring "loadtest" in namespace kshard-loadtest, which
// is installed with it (held by nobody, labelled for the ring's watch), and
// the RBAC binds the renamed ServiceAccount.
func TestFencingObjects(t *testing.T) {
	if _, err := controlplane.RepoRoot(); err != nil {
		t.Skip(err)
	}
	// The run's shard count, not deploy/base's: a ring of 16 is fenced by
	// 16 bindings.
	for _, shards := range []int32{sharding.DefaultShards, 16} {
		objs, err := fencingObjects(LeaseNamespace, Ring, shards)
		if err != nil {
			t.Fatal(err)
		}
		kinds := map[string]int{}
		params, leases := map[string]bool{}, map[string]bool{}
		for i, o := range objs {
			kinds[o.GetKind()]++
			switch o.GetKind() {
			case "ValidatingAdmissionPolicy":
				if o.GetName() != Ring+"-shard-writes" && o.GetName() != Ring+"-shard-labels" {
					t.Errorf("policy %s", o.GetName())
				}
				conds, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchConditions")
				if len(conds) == 0 || !strings.Contains(conds[0].(map[string]any)["expression"].(string), "'"+serviceAccountUser(LeaseNamespace, replicaServiceAccount)+"'") {
					t.Errorf("policy's match conditions %v: want the load tester's ServiceAccount", conds)
				}
			case "ValidatingAdmissionPolicyBinding":
				policy, _, _ := unstructured.NestedString(o.Object, "spec", "policyName")
				if policy == Ring+"-shard-labels" {
					continue
				}
				name, _, _ := unstructured.NestedString(o.Object, "spec", "paramRef", "name")
				ns, _, _ := unstructured.NestedString(o.Object, "spec", "paramRef", "namespace")
				if policy != Ring+"-shard-writes" || ns != LeaseNamespace {
					t.Errorf("binding %s: policy %s, params in %s", o.GetName(), policy, ns)
				}
				params[name] = true
			case "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding":
				if o.GetNamespace() != "" || o.GetName() != Ring+"-shard-label" {
					t.Errorf("%s %s/%s: want cluster-scoped, named for ring %s", o.GetKind(), o.GetNamespace(), o.GetName(), Ring)
				}
				if ns, ok, _ := unstructured.NestedString(o.Object, "spec", "paramRef", "namespace"); ok && ns != LeaseNamespace {
					t.Errorf("shard-label binding's table in %s, want %s", ns, LeaseNamespace)
				}
			case "Lease":
				if o.GetNamespace() != LeaseNamespace || o.GetLabels()["kshard.dev/ring"] != Ring || o.GetLabels()["kshard.dev/lease-kind"] != lease.KindShard {
					t.Errorf("Lease %s/%s labelled %v: want in %s, labelled a shard Lease of ring %s", o.GetNamespace(), o.GetName(), o.GetLabels(), LeaseNamespace, Ring)
				}
				if _, held, _ := unstructured.NestedString(o.Object, "spec", "holderIdentity"); held {
					t.Errorf("Lease %s ships with a holder", o.GetName())
				}
				for _, b := range objs[:i] {
					if b.GetKind() == "ValidatingAdmissionPolicyBinding" {
						t.Errorf("Lease %s applied after binding %s: the binding refuses everyone until it exists", o.GetName(), b.GetName())
						break
					}
				}
				leases[o.GetName()] = true
			case "ClusterRoleBinding", "RoleBinding":
				subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
				for _, s := range subjects {
					if m := s.(map[string]any); m["namespace"] != LeaseNamespace {
						t.Errorf("%s %s binds %v", o.GetKind(), o.GetName(), m)
					}
				}
			}
		}
		for n := range shards {
			if !params[lease.ShardName(Ring, n)] {
				t.Errorf("no binding takes Lease %s", lease.ShardName(Ring, n))
			}
			if !leases[lease.ShardName(Ring, n)] {
				t.Errorf("Lease %s not installed", lease.ShardName(Ring, n))
			}
		}
		if kinds["ValidatingAdmissionPolicy"] != 2 || kinds["ValidatingAdmissionPolicyBinding"] != int(shards)+1 || kinds["MutatingAdmissionPolicy"] != 1 || kinds["MutatingAdmissionPolicyBinding"] != 1 || kinds["ServiceAccount"] != 1 || kinds["ClusterRole"] == 0 || kinds["Role"] == 0 {
			t.Errorf("objects by kind %v", kinds)
		}
	}
}
