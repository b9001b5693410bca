package shardwrites

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding/lease"
)

// The policies of a ring, after its name: <ring>-shard-writes and so on.
const (
	// policyShardWrites refuses a write to an object that is, or was
	// before the write, in shard n unless the writing pod holds shard n's
	// Lease (bound once per shard: Bindings).
	policyShardWrites = "shard-writes"
	// policyShardLabels refuses a write that leaves an object in no shard
	// of the ring (Labels).
	policyShardLabels = "shard-labels"
	// policyLabelerWrites refuses a shard label stamped on a For object,
	// or a write of the shard table, unless the pod holds the labeler
	// Lease.
	policyLabelerWrites = "labeler-writes"
	// policyForWrites refuses a replica's change to a For object other
	// than its shard and domain labels (Ring.LabelsOnly).
	policyForWrites = "for-writes"
	// policyLeaseDeletes refuses the deletion of a shard or labeler
	// Lease, or of another replica's member Lease.
	policyLeaseDeletes = "lease-deletes"
	// policyShardLabel is the MutatingAdmissionPolicy that labels a For
	// object at its creation from the shard table.
	policyShardLabel = "shard-label"
	// policyDomain refuses anyone's change of a For object's domain label
	// (Ring.ImmutableDomain).
	policyDomain = "domain"
)

// podVariable is the name of the writing pod, from its pod-bound token.
var podVariable = admissionregistrationv1.Variable{Name: "pod", Expression: "'authentication.kubernetes.io/pod-name' in request.userInfo.extra && " +
	"size(request.userInfo.extra['authentication.kubernetes.io/pod-name']) > 0 ? " +
	"request.userInfo.extra['authentication.kubernetes.io/pod-name'][0] : ''"}

// holderVariable is the holder of the Lease that is the param.
var holderVariable = admissionregistrationv1.Variable{Name: "holder", Expression: "has(params.spec.holderIdentity) ? params.spec.holderIdentity : ''"}

// notHolder says why a pod that does not hold the param's Lease may not
// write: what follows it is the policy's.
const notHolder = "'kshard fencing: pod ' + (variables.pod == '' ? '(none: not a pod-bound token)' : variables.pod) + " +
	"' does not hold Lease ' + params.metadata.name + ' (holder: ' + (variables.holder == '' ? 'nobody' : variables.holder) + '), "

// holds is the CEL test that the writing pod holds the param's Lease: a
// holder identity is <pod>_<random> (sharding's Identity).
const holds = "variables.pod != '' && variables.holder.startsWith(variables.pod + '_')"

// replicas is the match condition that limits a policy to the ring's
// replicas' tokens.
func (r Ring) replicas() admissionregistrationv1.MatchCondition {
	return admissionregistrationv1.MatchCondition{Name: r.Name + "-replicas", Expression: fmt.Sprintf("request.userInfo.username == %s", celString(r.username()))}
}

// rules matches ops on resources, one rule per group in the order they
// first appear.
func rules(ops []admissionregistrationv1.OperationType, resources ...Resource) []admissionregistrationv1.NamedRuleWithOperations {
	var out []admissionregistrationv1.NamedRuleWithOperations
	at := map[string]int{}
	for _, res := range resources {
		i, ok := at[res.Group]
		if !ok {
			i = len(out)
			at[res.Group] = i
			out = append(out, admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
				Operations: ops,
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{res.Group}, APIVersions: []string{"*"}},
			}})
		}
		out[i].Rule.Resources = append(out[i].Rule.Resources, res.Resource)
	}
	return out
}

var (
	createUpdateDelete = []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}
	updateOnly         = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
)

// stamp is the CEL test that a write is the labeler's stamp of a shard
// label on a For object: with LabelsOnly any update of a For object's main
// resource that leaves a shard label (the replicas change nothing else of
// it); otherwise an update that sets or changes its shard label.
func (r Ring) stamp() string {
	label := celString(r.keys().Shard)
	s := fmt.Sprintf("request.resource.resource == %s && (!has(request.subResource) || request.subResource == '') && "+
		"has(object.metadata.labels) && %s in object.metadata.labels", celString(r.For.Resource), label)
	if !r.LabelsOnly {
		s += fmt.Sprintf(" && (!has(oldObject.metadata.labels) || !(%[1]s in oldObject.metadata.labels) || oldObject.metadata.labels[%[1]s] != object.metadata.labels[%[1]s])", label)
	}
	return s
}

// shardWritesPolicy is policyShardWrites.
func (r Ring) shardWritesPolicy() *admissionregistrationv1.ValidatingAdmissionPolicy {
	forOps := updateOnly
	if !r.LabelsOnly {
		forOps = []admissionregistrationv1.OperationType{admissionregistrationv1.Update, admissionregistrationv1.Delete}
	}
	return validatingPolicy(r.policy(policyShardWrites), admissionregistrationv1.ValidatingAdmissionPolicySpec{
		FailurePolicy: ptr.To(admissionregistrationv1.Fail),
		ParamKind:     &admissionregistrationv1.ParamKind{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		// The For kind's own updates (the holder removing a wrong
		// label; without LabelsOnly, its writes), never its creates:
		// users' creates stay out of this policy and of a missing
		// Lease.
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: append(rules(createUpdateDelete, r.Writes...), rules(forOps, r.For)...)},
		MatchConditions:  []admissionregistrationv1.MatchCondition{r.replicas()},
		Variables:        []admissionregistrationv1.Variable{podVariable, holderVariable, {Name: "labelerStamp", Expression: r.stamp()}},
		Validations: []admissionregistrationv1.Validation{{
			Expression:        "variables.labelerStamp || (" + holds + ")",
			MessageExpression: notHolder + "so it may not write an object that is or was in its shard'",
			Reason:            ptr.To(metav1.StatusReasonForbidden),
		}},
	})
}

// labelerWrites is policyLabelerWrites and its binding, whose param is the
// labeler Lease. A missing Lease admits (parameterNotFoundAction Allow):
// the policy matches every For update and ConfigMap write, whoever makes
// it, and a labeler Lease that does not exist is free for any replica of
// the ring to create and hold, which the replicas cannot undo once it
// exists (policyLeaseDeletes).
func (r Ring) labelerWrites() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	var written []Resource
	var what []string
	if r.ShardTable != "" {
		written = append(written, Resource{Resource: "configmaps"})
		what = append(what, fmt.Sprintf("(request.resource.resource == 'configmaps' && request.namespace == %s && request.name == %s)", celString(r.Namespace), celString(r.ShardTable)))
	}
	what = append(what, "("+r.stamp()+")")
	resourceRules := rules(createUpdateDelete, written...)
	resourceRules = append(resourceRules, rules(updateOnly, r.For)...)
	message := notHolder + "so it may not label " + r.For.Resource
	if r.ShardTable != "" {
		message += " or write the shard table"
	}
	policy := validatingPolicy(r.policy(policyLabelerWrites), admissionregistrationv1.ValidatingAdmissionPolicySpec{
		FailurePolicy:    ptr.To(admissionregistrationv1.Fail),
		ParamKind:        &admissionregistrationv1.ParamKind{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: resourceRules},
		MatchConditions:  []admissionregistrationv1.MatchCondition{r.replicas(), {Name: "labeler-writes", Expression: strings.Join(what, " || ")}},
		Variables:        []admissionregistrationv1.Variable{podVariable, holderVariable},
		Validations: []admissionregistrationv1.Validation{{
			Expression:        holds,
			MessageExpression: message + "'",
			Reason:            ptr.To(metav1.StatusReasonForbidden),
		}},
	})
	return policy, r.binding(policyLabelerWrites, &admissionregistrationv1.ParamRef{
		Name: lease.LabelerName(r.Name), Namespace: r.Namespace, ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction)})
}

// forWrites is policyForWrites and its binding: with LabelsOnly, a
// replica changes a For object's shard and domain labels and nothing else
// (the spec is its user's; RBAC's patch on the main resource exists only
// for the labels: the labeler's stamp, a holder's removal of a wrong one).
func (r Ring) forWrites() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	keys := r.keys()
	labels := fmt.Sprintf("%s and %s labels", keys.Shard, keys.Domain)
	reason := ptr.To(metav1.StatusReasonForbidden)
	policy := validatingPolicy(r.policy(policyForWrites), admissionregistrationv1.ValidatingAdmissionPolicySpec{
		FailurePolicy:    ptr.To(admissionregistrationv1.Fail),
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: rules(updateOnly, r.For)},
		MatchConditions:  []admissionregistrationv1.MatchCondition{r.replicas()},
		Variables:        []admissionregistrationv1.Variable{{Name: "ringLabels", Expression: fmt.Sprintf("[%s, %s]", celString(keys.Shard), celString(keys.Domain))}},
		Validations: []admissionregistrationv1.Validation{
			{
				// Of a kind with no spec (a built-in with data), the
				// comparison is of nothing: has() guards it.
				Expression: "has(object.spec) == has(oldObject.spec) && (!has(object.spec) || object.spec == oldObject.spec)",
				Message:    fmt.Sprintf("kshard fencing: a replica may change only a %s object's %s, not its spec", r.For.Resource, labels),
				Reason:     reason,
			},
			{
				Expression: "has(object.metadata.annotations) == has(oldObject.metadata.annotations) && " +
					"(!has(object.metadata.annotations) || object.metadata.annotations == oldObject.metadata.annotations) && " +
					"has(object.metadata.finalizers) == has(oldObject.metadata.finalizers) && " +
					"(!has(object.metadata.finalizers) || object.metadata.finalizers == oldObject.metadata.finalizers) && " +
					"has(object.metadata.ownerReferences) == has(oldObject.metadata.ownerReferences) && " +
					"(!has(object.metadata.ownerReferences) || object.metadata.ownerReferences == oldObject.metadata.ownerReferences)",
				Message: fmt.Sprintf("kshard fencing: a replica may change only a %s object's %s, not its annotations, finalizers or owners", r.For.Resource, labels),
				Reason:  reason,
			},
			{
				Expression: "(!has(oldObject.metadata.labels) || oldObject.metadata.labels.all(k, k in variables.ringLabels || " +
					"  (has(object.metadata.labels) && k in object.metadata.labels && object.metadata.labels[k] == oldObject.metadata.labels[k]))) && " +
					"(!has(object.metadata.labels) || object.metadata.labels.all(k, k in variables.ringLabels || " +
					"  (has(oldObject.metadata.labels) && k in oldObject.metadata.labels)))",
				Message: fmt.Sprintf("kshard fencing: a replica may change only a %s object's %s, not its other labels", r.For.Resource, labels),
				Reason:  reason,
			},
		},
	})
	return policy, r.binding(policyForWrites, nil)
}

// leaseDeletes is policyLeaseDeletes and its binding. RBAC lets the
// replicas delete Leases in their namespace: a leaving replica deletes its
// member Lease. Nothing else: a shard's Lease is released (no holder),
// never deleted, so a write to its shard is always checked against it; the
// labeler Lease likewise. Matched by name, which an update cannot change
// (labels can).
func (r Ring) leaseDeletes() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	policy := validatingPolicy(r.policy(policyLeaseDeletes), admissionregistrationv1.ValidatingAdmissionPolicySpec{
		FailurePolicy: ptr.To(admissionregistrationv1.Fail),
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: rules(
			[]admissionregistrationv1.OperationType{admissionregistrationv1.Delete}, Resource{Group: "coordination.k8s.io", Resource: "leases"})},
		MatchConditions: []admissionregistrationv1.MatchCondition{r.replicas()},
		Variables:       []admissionregistrationv1.Variable{podVariable},
		Validations: []admissionregistrationv1.Validation{{
			Expression: fmt.Sprintf("variables.pod != '' && request.name.endsWith(%s + variables.pod)", celString(strings.TrimSuffix(lease.MemberName(r.Name, "x"), "x"))),
			MessageExpression: "'kshard fencing: a replica deletes only its own member Lease; pod ' + " +
				"(variables.pod == '' ? '(none: not a pod-bound token)' : variables.pod) + ' may not delete Lease ' + request.name",
			Reason: ptr.To(metav1.StatusReasonForbidden),
		}},
	})
	return policy, r.binding(policyLeaseDeletes, nil)
}

// ShardLabel is policyShardLabel and its binding: on the creation of a For
// object whose domain is in the labeler's shard table (its param), the API
// server stamps the shard and domain labels itself, so the object is in
// its shard's cache from its first watch event and costs no label patch. A
// domain not in the table, a table that is missing, or a policy that
// fails: the object is created unlabelled, as without the policy
// (failurePolicy Ignore, parameterNotFoundAction Allow), and the labeler
// labels it. "add" replaces a label that is there: the policy overwrites a
// shard label set by hand.
func (r Ring) ShardLabel() (*admissionregistrationv1.MutatingAdmissionPolicy, *admissionregistrationv1.MutatingAdmissionPolicyBinding) {
	keys := r.keys()
	escape := func(label string) string { return strings.NewReplacer("~", "~0", "/", "~1").Replace(label) }
	policy := &admissionregistrationv1.MutatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "MutatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: r.policy(policyShardLabel)},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			FailurePolicy:      ptr.To(admissionregistrationv1.Ignore),
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
			ParamKind:          &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: rules(
				[]admissionregistrationv1.OperationType{admissionregistrationv1.Create}, r.For)},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "known-domain",
				Expression: fmt.Sprintf("%s && has(params.data) && %s in params.data", r.domainPresent(), r.domainValue())}},
			Mutations: []admissionregistrationv1.Mutation{{
				PatchType: admissionregistrationv1.PatchTypeJSONPatch,
				JSONPatch: &admissionregistrationv1.JSONPatch{Expression: fmt.Sprintf(
					"(has(object.metadata.labels) ? [] : [JSONPatch{op: \"add\", path: \"/metadata/labels\", value: {}}]) + [\n"+
						"  JSONPatch{op: \"add\", path: \"/metadata/labels/%[1]s\", value: params.data[%[3]s]},\n"+
						"  JSONPatch{op: \"add\", path: \"/metadata/labels/%[2]s\", value: %[3]s}\n]",
					escape(keys.Shard), escape(keys.Domain), r.domainValue())},
			}},
		},
	}
	binding := &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "MutatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: r.policy(policyShardLabel)},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{
			PolicyName: r.policy(policyShardLabel),
			ParamRef: &admissionregistrationv1.ParamRef{Name: r.ShardTable, Namespace: r.Namespace,
				ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction)},
		},
	}
	return policy, binding
}

// immutableDomain is policyDomain and its binding: for every user, an
// update of a For object that has the domain label keeps it as it was.
func (r Ring) immutableDomain() (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	key := celString(r.domainLabel())
	policy := validatingPolicy(r.policy(policyDomain), admissionregistrationv1.ValidatingAdmissionPolicySpec{
		FailurePolicy:    ptr.To(admissionregistrationv1.Fail),
		MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: rules(updateOnly, r.For)},
		MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "has-a-domain",
			Expression: fmt.Sprintf("has(oldObject.metadata.labels) && %s in oldObject.metadata.labels", key)}},
		Validations: []admissionregistrationv1.Validation{{
			Expression: fmt.Sprintf("has(object.metadata.labels) && %[1]s in object.metadata.labels && object.metadata.labels[%[1]s] == oldObject.metadata.labels[%[1]s]", key),
			Message: fmt.Sprintf("label %s is the domain ring %s shards %s by: it cannot change or go (create the object anew instead)",
				r.domainLabel(), r.Name, r.For.Resource),
			Reason: ptr.To(metav1.StatusReasonInvalid),
		}},
	})
	return policy, r.binding(policyDomain, nil)
}

// validatingPolicy is a ValidatingAdmissionPolicy named name.
func validatingPolicy(name string, spec admissionregistrationv1.ValidatingAdmissionPolicySpec) *admissionregistrationv1.ValidatingAdmissionPolicy {
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       spec,
	}
}

// binding binds one of the ring's validating policies, with param when it
// takes one.
func (r Ring) binding(what string, param *admissionregistrationv1.ParamRef) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: r.policy(what)},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        r.policy(what),
			ParamRef:          param,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
}
