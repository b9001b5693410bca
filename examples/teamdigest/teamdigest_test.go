package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding/ring"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	os.Exit(controlplane.RunTestsWith(m, &cp, controlplane.Options{}))
}

const namespace = "team-digest"

// TestTeamDigest runs two replicas of the example as its deployment runs
// them (its namespace, RBAC and the fence kshard fencing wrote for its ring,
// each replica with a token bound to a Pod of its name) against a real API
// server: every team ConfigMap gets its digest, others are never touched,
// the fence refuses a replica's write to a shard it does not hold and to a
// ConfigMap outside the ring, and a replica's leave hands its teams over.
func TestTeamDigest(t *testing.T) {
	controlplane.Require(t, cp)
	ctx := context.Background()
	admin, err := client.New(cp.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"namespace.yaml", "rbac.yaml", "fence.yaml"} {
		applyFile(t, admin, "deploy/"+file)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "teams-"}}
	if err := admin.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cms := map[string]string{} // name → team
	for i := range 12 {
		team := fmt.Sprintf("team-%c", 'a'+i%6)
		name := fmt.Sprintf("settings-%d", i)
		cms[name] = team
		if err := admin.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name, Labels: map[string]string{teamLabel: team}},
			Data:       map[string]string{"replicas": fmt.Sprint(i)},
		}); err != nil {
			t.Fatal(err)
		}
	}
	outside := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "not-a-team"}, Data: map[string]string{"a": "b"}}
	if err := admin.Create(ctx, outside); err != nil {
		t.Fatal(err)
	}

	stops := map[string]func(){}
	for _, id := range []string{"team-digest-0", "team-digest-1"} {
		cfg := podConfig(t, admin, id)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- run(rctx, cfg, options{ring: "team-digest", namespace: namespace, identity: id, shards: 16, probes: "0", metrics: "0", peers: true})
		}()
		stops[id] = func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("replica %s: %v", id, err)
			}
		}
		t.Cleanup(func() {
			if stop := stops[id]; stop != nil {
				stop()
			}
		})
	}
	digested := func(what string) map[string]string {
		t.Helper()
		shards := map[string]string{}
		controlplane.Eventually(t, 2*time.Minute, what, func() error {
			var list corev1.ConfigMapList
			if err := admin.List(ctx, &list, client.InNamespace(ns.Name)); err != nil {
				return err
			}
			for _, cm := range list.Items {
				_, team := cms[cm.Name]
				switch {
				case !team && (cm.Annotations[digestAnnotation] != "" || len(cm.Labels) > 0):
					return fmt.Errorf("%s, not a team's, was written: %v %v", cm.Name, cm.Labels, cm.Annotations)
				case team && cm.Annotations[digestAnnotation] != digestOf(cm.Data):
					return fmt.Errorf("%s: digest %q", cm.Name, cm.Annotations[digestAnnotation])
				case team:
					shards[cm.Name] = cm.Labels["teams.example.dev/shard"]
				}
			}
			return nil
		})
		return shards
	}
	shards := digested("every team ConfigMap digested")

	// The ring settled: both replicas in it, each shard held by the
	// replica the ring gives it (ring.ReadStatus, as kshard status reads
	// kshard's).
	holder := map[string]string{} // shard → replica
	controlplane.Eventually(t, 2*time.Minute, "the ring settled on two replicas", func() error {
		st, err := ring.ReadStatus(ctx, admin, ring.StatusOptions{Namespace: namespace, Ring: "team-digest",
			Kind: corev1.SchemeGroupVersion.WithKind("ConfigMap"), LabelPrefix: "teams.example.dev"})
		if err != nil {
			return err
		}
		live := 0
		for _, m := range st.Members {
			if m.Live {
				live++
			}
		}
		if live != 2 || len(st.Unowned) > 0 {
			return fmt.Errorf("%d live members, unowned shards %v", live, st.Unowned)
		}
		for _, sh := range st.Shards {
			if sh.Desired == "" || !strings.HasPrefix(sh.Holder, sh.Desired) {
				return fmt.Errorf("shard %d held by %q, the ring gives it to %q", sh.Shard, sh.Holder, sh.Desired)
			}
			holder[fmt.Sprint(sh.Shard)] = sh.Desired
		}
		return nil
	})
	shards = digested("every team ConfigMap digested on the settled ring")
	var victim string
	for name := range shards {
		victim = name
		break
	}
	owner := holder[shards[victim]]
	other := map[string]string{"team-digest-0": "team-digest-1", "team-digest-1": "team-digest-0"}[owner]
	if other == "" {
		t.Fatalf("%s's shard %s is held by %q", victim, shards[victim], owner)
	}

	// The fence: a replica's token may write neither a ConfigMap of a
	// shard it does not hold nor one outside the ring.
	attacker, err := client.New(podConfig(t, admin, other), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// (Dry runs, each until it is refused: the API server enforces a
	// policy once its informers have it, a moment after it was created; a
	// fence that never refuses fails after a minute.)
	refused := func(c client.Client, name, patch, reason, want string) {
		t.Helper()
		controlplane.Eventually(t, time.Minute, fmt.Sprintf("patch %s of %s refused (%s)", patch, name, want), func() error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name}}
			err := c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(patch)), client.DryRunAll)
			if apierrors.ReasonForError(err) != metav1.StatusReason(reason) || !strings.Contains(err.Error(), want) {
				return fmt.Errorf("admitted or refused otherwise: %v", err)
			}
			return nil
		})
	}
	for _, name := range []string{victim, outside.Name} {
		refused(attacker, name, `{"metadata":{"annotations":{"x":"y"}}}`, string(metav1.StatusReasonForbidden), "kshard fencing")
	}

	// A team is a domain: nobody, an administrator neither, moves a
	// ConfigMap to another team or out of the ring.
	for _, patch := range []string{`{"metadata":{"labels":{"example.dev/team":"team-z"}}}`, `{"metadata":{"labels":{"example.dev/team":null}}}`} {
		refused(admin, victim, patch, string(metav1.StatusReasonInvalid), "it cannot change or go")
	}

	// A graceful leave: the replica that stays takes the leaver's teams,
	// and a change to one of them is digested.
	stops[owner]()
	stops[owner] = nil
	cm := &corev1.ConfigMap{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: victim}, cm); err != nil {
		t.Fatal(err)
	}
	cm.Data["replicas"] = "42"
	if err := admin.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
	digested("the leaver's teams digested by the replica that stayed")
}

// applyFile creates the objects of one of the deployment's files.
func applyFile(t *testing.T, c client.Client, path string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(raw, []byte("\n---\n")) {
		var o unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &o.Object); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if o.Object == nil {
			continue // a comment
		}
		if err := c.Create(context.Background(), &o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: %s %s: %v", path, o.GetKind(), o.GetName(), err)
		}
	}
}

// podConfig is a client configuration of the ServiceAccount's token bound
// to a Pod named id (created, never run), as a StatefulSet's replica has.
func podConfig(t *testing.T, admin client.Client, id string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: id},
		Spec: corev1.PodSpec{
			ServiceAccountName: namespace, AutomountServiceAccountToken: ptr.To(false),
			NodeSelector: map[string]string{"example.dev/test": "no-node"},
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(65532)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "teamdigest", Image: "teamdigest:test", SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}},
		},
	}
	if err := admin.Create(ctx, pod); apierrors.IsAlreadyExists(err) {
		err = admin.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		if err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(3600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: namespace}}
	if err := admin.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg
}
