package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/ring"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { os.Exit(controlplane.RunTests(m, &cp)) }

// buildKshard builds kshard from this checkout, into
// bin/test/children/kshard (childproc.Build says why a folder that stays).
func buildKshard(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins, err := childproc.Build(context.Background(), root, filepath.Join(root, "bin", "test", "children", "kshard"), "kshard")
	if err != nil {
		t.Fatal(err)
	}
	return bins[0]
}

// start runs a child process that the test kills at the end, and shows its
// log when the test failed.
func start(t *testing.T, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		logFile.Close()
		if t.Failed() {
			if out, err := os.ReadFile(logPath); err == nil {
				t.Logf("log of %s (tail):\n%s", name, out[max(0, len(out)-3000):])
			}
		}
	})
	return cmd
}

// newEnv returns an admin client of the control plane, a kubeconfig file of
// it for the replicas, and two new namespaces: the objects' and the Leases'.
func newEnv(ctx context.Context, t *testing.T, prefix string) (c client.Client, kubeconfig, ns, leaseNS string) {
	t.Helper()
	c, err := client.New(cp.Config, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeconfigBytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	var namespaces []string
	for _, p := range []string{prefix, prefix + "-leases"} {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: p + "-"}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		namespaces = append(namespaces, n.Name)
	}
	return c, kubeconfig, namespaces[0], namespaces[1]
}

// e2eShards is the replicas' shard count. Every held shard Lease is renewed
// once per --retry-period, so the count sets how busy the API server and the
// replicas are while the test waits; what it checks (every binding Ready, in
// a held shard, after a SIGKILL) holds for any count. A quarter of the
// default still gives each of three replicas several shards.
const e2eShards = 16

// e2eObjects is how many ConfigBindings the replicas reconcile: four per
// domain of the config center's 50, so that every shard has some and a
// killed replica leaves objects to take over. Each costs the API server about
// seven writes (create, label, ConfigMap, status, and again after the
// update), which make test pays in CPU.
const e2eObjects = 200

// allReady checks every binding: Synced at its current generation, in a
// shard that a live replica holds.
func allReady(ctx context.Context, c client.Client, ns, leaseNS string) error {
	var list configv1alpha1.ConfigBindingList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return err
	}
	st, err := ring.ReadStatus(ctx, c, ring.StatusOptions{Namespace: leaseNS, Ring: "e2e", Kind: configv1alpha1.GroupVersion.WithKind("ConfigBinding"), LabelPrefix: sharding.DefaultLabelPrefix})
	if err != nil {
		return err
	}
	notReady := 0
	var example string
	for _, cb := range list.Items {
		cond := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
		shard, ok := ring.KeysFor(sharding.DefaultLabelPrefix).ShardLabel(cb.Labels, e2eShards)
		switch {
		case cond == nil || cond.Reason != configbinding.ReasonSynced || cb.Status.ObservedGeneration != cb.Generation || cond.ObservedGeneration != cb.Generation:
			example = fmt.Sprintf("%s: generation %d, status %+v", cb.Name, cb.Generation, cb.Status)
		case !ok || ptr.Deref(cb.Status.Shard, -1) != shard:
			example = fmt.Sprintf("%s: label shard %d, status shard %v", cb.Name, shard, cb.Status.Shard)
		case st.Shards[shard].Holder == "":
			example = fmt.Sprintf("%s: shard %d held by nobody", cb.Name, shard)
		default:
			continue
		}
		notReady++
	}
	if notReady > 0 {
		return fmt.Errorf("%d of %d not ready, e.g. %s", notReady, len(list.Items), example)
	}
	return nil
}

// TestEndToEnd runs the real binaries: an etcd as the config center and three kshard
// controller processes reconcile 200 ConfigBindings over 50 domains; after
// one replica is killed with SIGKILL and every object is updated, all are
// Ready again at their new generation, each reconciled by the current
// holder of its shard.
func TestEndToEnd(t *testing.T) {
	controlplane.Require(t, cp)
	ctx := context.Background()
	kshardBin := buildKshard(t)
	c, kubeconfig, ns, leaseNS := newEnv(ctx, t, "e2e")

	etcd := startConfigCenter(ctx, t)
	ec, err := etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	if _, err := configetcd.Seed(ctx, ec, etcdsource.DefaultPrefix, configcenter.SeedOptions{Domains: 50, KeysPerDomain: 4, ValueBytes: 32}); err != nil {
		t.Fatal(err)
	}

	replicas := map[string]*exec.Cmd{}
	for i := range 3 {
		id := fmt.Sprintf("kshard-%d", i)
		replicas[id] = start(t, id, kshardBin, "controller",
			"--kubeconfig", kubeconfig, "--replica-id", id, "--ring", "e2e", "--lease-namespace", leaseNS,
			"--etcd-servers", etcd.Endpoint(), "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
			"--lease-duration", "6s", "--renew-deadline", "4s", "--retry-period", "1s", "--zap-log-level", "info",
			"--shards", fmt.Sprint(e2eShards))
	}

	// Eight writers at a time: 200 round trips one after another are seconds
	// of waiting.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range e2eObjects {
		g.Go(func() error {
			return c.Create(gctx, &configv1alpha1.ConfigBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cb-%d", i)},
				Spec: configv1alpha1.ConfigBindingSpec{
					Domain: fmt.Sprintf("domain-%d", i%50),
					Keys:   []configv1alpha1.ConfigKey{"key-0", "key-1"},
					Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: fmt.Sprintf("cb-%d-config", i)},
				},
			})
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 5*time.Minute, fmt.Sprintf("all %d Ready", e2eObjects), func() error { return allReady(ctx, c, ns, leaseNS) })

	if err := replicas["kshard-1"].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = replicas["kshard-1"].Wait()
	var list configv1alpha1.ConfigBindingList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range list.Items {
		key := client.ObjectKeyFromObject(&list.Items[i])
		// Replicas patch status meanwhile: update the spec on the latest version.
		g.Go(func() error {
			return retry.RetryOnConflict(retry.DefaultRetry, func() error {
				var cb configv1alpha1.ConfigBinding
				if err := c.Get(gctx, key, &cb); err != nil {
					return err
				}
				cb.Spec.Keys = append(cb.Spec.Keys, "key-2")
				return c.Update(gctx, &cb)
			})
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, 5*time.Minute, fmt.Sprintf("all %d Ready at their new generation after SIGKILL", e2eObjects), func() error {
		return allReady(ctx, c, ns, leaseNS)
	})
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cb-7-config"}, &cm); err != nil {
		t.Fatal(err)
	}
	if len(cm.Data) != 3 || cm.Data["key-2"] == "" {
		t.Fatalf("cb-7-config data after the update: %v", cm.Data)
	}
}
