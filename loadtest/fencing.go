package loadtest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/internal/shardwrites"
)

// The load tester's sharded replicas run as deploy/base runs them on a
// cluster, so that the API server fences their writes as it would there:
// each replica process authenticates with a token of deploy/base's
// ServiceAccount bound to a Pod object of its own name (the pod a
// StatefulSet would run as that replica; created, never run), with
// deploy/base's RBAC, and deploy/base's kshard-shard-writes
// ValidatingAdmissionPolicy refuses a write to a shard's objects by a pod
// that does not hold the shard's Lease. A write delayed past its writer's
// tenure (the chaos scenario's delay fault) is then refused by the API
// server, where the process's own fence (WriteContext) cannot stop it.
//
// Replicas with sharding off and the plain controller keep the load
// tester's own credentials: they hold no shard Lease, and the policy would
// refuse their every write.

// fieldOwner is the field manager of what the load tester applies.
const fieldOwner = "kshard-loadtest"

// fencingKinds are the kinds of deploy/base the run installs: the
// replicas' identity and RBAC, and its FlowSchemas. The fence itself is the
// run's ring's, from internal/shardwrites (fenceFor).
var fencingKinds = map[string]bool{
	"ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true,
	// The replicas' initial syncs in their own priority level, as on a
	// cluster with deploy/base (the scale scenario compares an API server
	// restart with and without it).
	"FlowSchema": true, "PriorityLevelConfiguration": true,
}

// fencing is deploy/base's identity and fencing as installed for the run's
// replica processes, and the pod-bound tokens minted so far.
type fencing struct {
	c client.Client
	// kubeconfig is the load tester's own, whose cluster (server and CA)
	// the replicas' kubeconfigs name.
	kubeconfig *clientcmdapi.Config
	dir        string
	// enforced says the fencing policy is bound (not Options.NoFencing).
	enforced bool

	mu sync.Mutex
	// tokens are the pod-bound tokens by replica identity.
	tokens map[string]string
	// flowSchema is deploy/base's kshard-syncs FlowSchema as installed,
	// for setFlowSchema (its kshard-leases FlowSchema stays).
	flowSchema *unstructured.Unstructured
}

// syncsFlowSchema names deploy/base's FlowSchema of the replicas' syncs,
// before the run's suffix.
const syncsFlowSchema = "kshard-syncs"

// installFencing applies deploy/base's ServiceAccount and RBAC (with the
// mirror component's, for --external-source=mirror) into LeaseNamespace,
// renamed as a user's overlay with `namespace:` would rename them, and the
// fence `kshard fencing` writes for the run's ring there (fenceFor).
func installFencing(ctx context.Context, c client.Client, o Options, kubeconfig, work string) (*fencing, error) {
	objs, err := fencingObjects(LeaseNamespace, Ring, o.Shards)
	if err != nil {
		return nil, fmt.Errorf("building deploy/base's fencing: %w", err)
	}
	fe := &fencing{c: c, dir: filepath.Join(work, "kubeconfigs"), tokens: map[string]string{}, enforced: !o.NoFencing}
	for _, obj := range objs {
		if obj.GetKind() == "ValidatingAdmissionPolicyBinding" && !fe.enforced {
			// A previous run's binding on the cluster would still fence.
			if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("deleting %s %s (--no-fencing): %w", obj.GetKind(), obj.GetName(), err)
			}
			continue
		}
		if obj.GetKind() == "FlowSchema" && strings.HasPrefix(obj.GetName(), syncsFlowSchema) {
			// A copy, through JSON (kustomize's numbers are ints, which
			// DeepCopy refuses): Apply fills obj in from the API server's
			// answer.
			if fe.flowSchema, err = jsonCopy(obj); err != nil {
				return nil, err
			}
		}
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			return nil, fmt.Errorf("applying %s %s of deploy/base: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	if fe.kubeconfig, err = clientcmd.LoadFromFile(kubeconfig); err != nil {
		return nil, fmt.Errorf("reading kubeconfig %s: %w", kubeconfig, err)
	}
	if err := os.MkdirAll(fe.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the replicas' kubeconfig folder: %w", err)
	}
	if err := fe.rbacInForce(ctx); err != nil {
		return nil, err
	}
	return fe, nil
}

// fencingObjects builds deploy/base with the mirror component into
// namespace ns and returns its objects of fencingKinds, renamed for ns, and
// the fence of ring (fenceFor).
func fencingObjects(ns, ring string, shards int32) ([]*unstructured.Unstructured, error) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return nil, err
	}
	src := filepath.Join(root, "deploy")
	mem := filesys.MakeFsInMemory()
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		return mem.WriteFile(filepath.Join("/deploy", rel), b)
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", src, err)
	}
	overlay := fmt.Sprintf("resources:\n- ../base\nnamespace: %s\ncomponents:\n- ../mirror\n", ns)
	if err := mem.WriteFile("/deploy/loadtest-overlay/kustomization.yaml", []byte(overlay)); err != nil {
		return nil, err
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/deploy/loadtest-overlay")
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, rs := range res.Resources() {
		if !fencingKinds[rs.GetKind()] {
			continue
		}
		m, err := rs.Map()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rs.CurId(), err)
		}
		o := &unstructured.Unstructured{Object: m}
		if err := renameFor(o, ns); err != nil {
			return nil, fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
		out = append(out, o)
	}
	fence, err := fenceFor(ns, ring, shards)
	if err != nil {
		return nil, err
	}
	return append(out, fence...), nil
}

// fenceFor is the admission fence `kshard fencing` writes for the run's
// ring, in the order to apply it (the Leases before the bindings that take
// them as params), of the policies that decide when a replica may write:
// the shard-writes policy with a binding per shard, the shard-labels
// policy, and the shard-label policy that labels an object at its
// creation. The policies that limit what a replica may write (its
// ConfigBinding changes, its Lease deletes) are not what the load tester
// measures, nor is the labeler's: its stamps are checked against the
// labeler Lease by the audit log.
func fenceFor(ns, ring string, shards int32) ([]*unstructured.Unstructured, error) {
	r := shardwrites.DefaultRing()
	r.Name, r.Namespace, r.Shards = ring, ns, shards
	measured := map[string]bool{r.Name + "-shard-writes": true, r.Name + "-shard-labels": true}
	var out []*unstructured.Unstructured
	for _, f := range r.Fence() {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(f)
		if err != nil {
			return nil, fmt.Errorf("the fence of %d shards: %w", shards, err)
		}
		o := &unstructured.Unstructured{Object: m}
		o.SetAPIVersion(f.GetObjectKind().GroupVersionKind().GroupVersion().String())
		o.SetKind(f.GetObjectKind().GroupVersionKind().Kind)
		policy := o.GetName()
		if o.GetKind() == "ValidatingAdmissionPolicyBinding" {
			policy, _, _ = unstructured.NestedString(o.Object, "spec", "policyName")
		}
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") && !measured[policy] {
			continue
		}
		out = append(out, o)
	}
	return out, nil
}

// renameFor renames one object of deploy/base for namespace ns, as a
// user's overlay with `namespace:` must beyond what kustomize does:
// cluster-scoped objects get ns as a suffix, so that they do not clash
// with a kshard installed on the cluster, and the FlowSchemas' subjects
// and priority levels follow.
func renameFor(o *unstructured.Unstructured, ns string) error {
	switch o.GetKind() {
	case "ClusterRole":
		o.SetName(o.GetName() + "-" + ns)
	case "ClusterRoleBinding":
		o.SetName(o.GetName() + "-" + ns)
		ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		return unstructured.SetNestedField(o.Object, ref+"-"+ns, "roleRef", "name")
	case "PriorityLevelConfiguration":
		o.SetNamespace("")
		o.SetName(o.GetName() + "-" + ns)
	case "FlowSchema":
		// Kustomize rewrites no FlowSchema subject.
		o.SetNamespace("")
		o.SetName(o.GetName() + "-" + ns)
		ref, _, _ := unstructured.NestedString(o.Object, "spec", "priorityLevelConfiguration", "name")
		if err := unstructured.SetNestedField(o.Object, ref+"-"+ns, "spec", "priorityLevelConfiguration", "name"); err != nil {
			return err
		}
		rules, _, err := unstructured.NestedSlice(o.Object, "spec", "rules")
		if err != nil {
			return err
		}
		for _, rule := range rules {
			subjects, _ := rule.(map[string]any)["subjects"].([]any)
			for _, sub := range subjects {
				if sa, ok := sub.(map[string]any)["serviceAccount"].(map[string]any); ok {
					sa["namespace"] = ns
				}
			}
		}
		return unstructured.SetNestedSlice(o.Object, rules, "spec", "rules")
	}
	return nil
}

// kubeconfigFor writes a kubeconfig for replica id: the load tester's cluster,
// reached at server ("host:port" of a proxy; "" for the cluster's own
// address), authenticated only with a token of deploy/base's ServiceAccount
// bound to the replica's Pod object, which it creates if missing.
func (fe *fencing) kubeconfigFor(ctx context.Context, id, server string) (string, error) {
	token, err := fe.token(ctx, id)
	if err != nil {
		return "", err
	}
	cfg := fe.kubeconfig.DeepCopy()
	kctx := cfg.Contexts[cfg.CurrentContext]
	if kctx == nil {
		return "", fmt.Errorf("the load tester's kubeconfig has no current context")
	}
	cluster := cfg.Clusters[kctx.Cluster]
	if cluster == nil {
		return "", fmt.Errorf("the load tester's kubeconfig has no cluster %q", kctx.Cluster)
	}
	if server != "" {
		// The proxy forwards TLS unchanged: the server's certificate
		// names the cluster's host, not the proxy's.
		if cluster.TLSServerName == "" {
			if host, err := serverHost(cluster.Server); err == nil {
				cluster.TLSServerName = host
			}
		}
		cluster.Server = "https://" + server
	}
	cfg.AuthInfos = map[string]*clientcmdapi.AuthInfo{id: {Token: token}}
	cfg.Contexts = map[string]*clientcmdapi.Context{id: {Cluster: kctx.Cluster, AuthInfo: id}}
	cfg.Clusters = map[string]*clientcmdapi.Cluster{kctx.Cluster: cluster}
	cfg.CurrentContext = id
	path := filepath.Join(fe.dir, id+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("writing the kubeconfig of %s: %w", id, err)
	}
	return path, nil
}

// serverHost is the host of a kubeconfig's server URL.
func serverHost(server string) (string, error) {
	u, err := url.Parse(server)
	if err != nil {
		return "", err
	}
	return u.Hostname(), nil
}

// token returns replica id's pod-bound token, minting one on first use:
// the Pod object the StatefulSet would run as that replica (deploy/base's
// ServiceAccount; a node selector no node has, so that a cluster with a
// scheduler leaves it pending), and a TokenRequest bound to it, as the
// kubelet mounts one. The API server then names the pod in the token's
// user extras, which the fencing policy checks against the Lease holders.
func (fe *fencing) token(ctx context.Context, id string) (string, error) {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	if t, ok := fe.tokens[id]; ok {
		return t, nil
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: id, Labels: map[string]string{"app.kubernetes.io/name": "kshard-loadtest"}},
		Spec: corev1.PodSpec{
			ServiceAccountName:           replicaServiceAccount,
			AutomountServiceAccountToken: ptr.To(false),
			NodeSelector:                 map[string]string{"kshard.dev/loadtest": "replica-processes-not-pods"},
			Containers:                   []corev1.Container{{Name: "kshard", Image: "kshard:loadtest-processes-not-pods"}},
		},
	}
	if err := fe.c.Create(ctx, pod); apierrors.IsAlreadyExists(err) {
		err = fe.c.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		if err == nil && pod.Spec.ServiceAccountName != replicaServiceAccount {
			err = fmt.Errorf("it runs as ServiceAccount %q, not %s", pod.Spec.ServiceAccountName, replicaServiceAccount)
		}
		if err != nil {
			return "", fmt.Errorf("pod %s/%s exists: %w", LeaseNamespace, id, err)
		}
	} else if err != nil {
		return "", fmt.Errorf("creating pod %s/%s: %w", LeaseNamespace, id, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: replicaServiceAccount}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		// Longer than any run; a pod-bound token ends with its pod anyway.
		ExpirationSeconds: ptr.To(int64((48 * time.Hour).Seconds())),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if err := fe.c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("requesting a token bound to pod %s/%s: %w", LeaseNamespace, id, err)
	}
	token := tr.Status.Token
	fe.tokens[id] = token
	return token, nil
}

// rbacInForce waits up to a minute until deploy/base's RBAC grants its
// ServiceAccount what a replica does first (list ConfigBindings, write the
// ring's Leases): RBAC reaches the authorizer through informers. It asks
// with SelfSubjectAccessReviews on a token of the ServiceAccount, so that
// the API server's counts of ConfigBinding syncs and Lease writes, which
// the reports read, see nothing of it.
func (fe *fencing) rbacInForce(ctx context.Context) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: replicaServiceAccount}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))}}
	if err := fe.c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", LeaseNamespace, replicaServiceAccount, err)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*fe.kubeconfig, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("the load tester's kubeconfig: %w", err)
	}
	cfg = rest.AnonymousClientConfig(cfg)
	cfg.BearerToken = tr.Status.Token
	c, err := client.New(cfg, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		return fmt.Errorf("a client of deploy/base's ServiceAccount: %w", err)
	}
	asks := []authorizationv1.ResourceAttributes{
		{Group: configv1alpha1.GroupVersion.Group, Resource: "configbindings", Verb: "list"},
		{Group: coordinationv1.GroupName, Resource: "leases", Verb: "update", Namespace: LeaseNamespace},
	}
	deadline := time.Now().Add(time.Minute)
	for _, attrs := range asks {
		for {
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}
			err := c.Create(ctx, review)
			if err == nil && review.Status.Allowed {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("deploy/base's RBAC does not let ServiceAccount %s/%s %s %s within a minute: %v %s",
					LeaseNamespace, replicaServiceAccount, attrs.Verb, attrs.Resource, err, review.Status.Reason)
			}
			if err := sleep(ctx, 200*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return nil
}

// setFlowSchema applies deploy/base's FlowSchema, or deletes it, so that the
// replicas' initial syncs queue in their own priority level or in the
// cluster's default one (workload-low, with every other ServiceAccount).
// The API server takes a change in asynchronously, within seconds.
func (fe *fencing) setFlowSchema(ctx context.Context, on bool) error {
	if fe.flowSchema == nil {
		return errors.New("deploy/base has no FlowSchema " + syncsFlowSchema)
	}
	o := fe.flowSchema.DeepCopy()
	if on {
		if err := fe.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(fieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying FlowSchema %s: %w", o.GetName(), err)
		}
		return nil
	}
	if err := fe.c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting FlowSchema %s: %w", o.GetName(), err)
	}
	return nil
}

// jsonCopy copies an object through its JSON form.
func jsonCopy(o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	b, err := o.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("copying %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	out := &unstructured.Unstructured{}
	if err := out.UnmarshalJSON(b); err != nil {
		return nil, fmt.Errorf("copying %s %s: %w", o.GetKind(), o.GetName(), err)
	}
	return out, nil
}
