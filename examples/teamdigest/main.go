// Command teamdigest is a second user of kshard's sharding library, built
// only on its public API: a controller of a built-in kind, sharded by team.
// Every ConfigMap labelled example.dev/team=<team> gets the digest of its
// data in its annotation example.dev/digest; the ConfigMaps of one team are
// one domain, so one replica of the StatefulSet holds them all, and the
// ConfigMaps without the label (kube-root-ca.crt, everyone else's) are
// never cached, labelled or written.
//
// Its deployment (examples/teamdigest/deploy) is the admission fence
// `kshard fencing` writes for its ring, its RBAC and its StatefulSet:
//
//	kshard fencing --ring team-digest --lease-namespace team-digest --service-account team-digest \
//	  --label-prefix teams.example.dev --shards 16 --shard-table team-digest-shard-table \
//	  --for configmaps --domain label:example.dev/team --writes= --labels-only=false --immutable-domain
//
// With --immutable-domain the fence also refuses anyone's change of a
// ConfigMap's team: a team is the ConfigMap's domain, and a ConfigMap moved
// to another team would move to another shard.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kshard/kshard/sharding"
)

const (
	// teamLabel names a ConfigMap's team: its domain, and what makes it
	// this controller's.
	teamLabel = "example.dev/team"
	// digestAnnotation is what the controller writes.
	digestAnnotation = "example.dev/digest"
)

// options are a replica's flags.
type options struct {
	// ring names the ring: its Leases are <ring>-shard-<n>.
	ring string
	// namespace holds the ring's Leases and shard table.
	namespace string
	// identity is the replica's ring position; "" is $POD_NAME.
	identity string
	// statefulSet is the replicas' StatefulSet; "" for none.
	statefulSet string
	shards      int32
	// probes and metrics are listen addresses; "0" turns one off.
	probes, metrics string
	// peers says other replicas run in this process (a test): their
	// controllers share a name.
	peers bool
}

func main() {
	var o options
	flag.StringVar(&o.ring, "ring", "team-digest", "the ring's name: its Leases are <ring>-shard-<n>")
	flag.StringVar(&o.namespace, "lease-namespace", os.Getenv("POD_NAMESPACE"), "the namespace of the ring's Leases and shard table")
	flag.StringVar(&o.statefulSet, "statefulset", "team-digest", "the replicas' StatefulSet, so that a rolling update moves no shard")
	shards := flag.Int("shards", 16, "the ring's shard count (kshard fencing --shards)")
	flag.StringVar(&o.probes, "health-probe-bind-address", ":8081", "where /readyz answers")
	flag.StringVar(&o.metrics, "metrics-bind-address", ":8080", "where /metrics answers")
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()
	o.shards = int32(*shards)
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zo)))
	if err := run(ctrl.SetupSignalHandler(), ctrl.GetConfigOrDie(), o); err != nil {
		ctrl.Log.Error(err, "teamdigest stopped")
		os.Exit(1)
	}
}

// run runs one replica until signal ends, then leaves the ring.
func run(signal context.Context, cfg *rest.Config, o options) error {
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:                 clientgoscheme.Scheme,
		HealthProbeBindAddress: o.probes,
		Metrics:                metricsserver.Options{BindAddress: o.metrics},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	team, err := labels.NewRequirement(teamLabel, selection.Exists, nil)
	if err != nil {
		return err
	}
	rep, err := sharding.New(mgr, sharding.Options{
		Ring: o.ring, LeaseNamespace: o.namespace, Identity: o.identity, StatefulSet: o.statefulSet, Shards: o.shards,
		LabelPrefix: "teams.example.dev", MetricsPrefix: "teamdigest",
		ShardTable: o.ring + "-shard-table",
		For:        sharding.Kind{Object: &corev1.ConfigMap{}, Selector: labels.NewSelector().Add(*team)},
		Domain:     func(obj client.Object) string { return obj.GetLabels()[teamLabel] },
	})
	if err != nil {
		return fmt.Errorf("joining ring %s: %w", o.ring, err)
	}
	if _, err := rep.NewController("teamdigest", &digester{shards: rep, c: mgr.GetClient()}, controller.TypedOptions[sharding.Request]{SkipNameValidation: &o.peers}); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ring", func(*http.Request) error { return rep.Ready() }); err != nil {
		return err
	}
	// Leave the ring before the manager stops the controller's workers:
	// the replicas taking this one's shards sync them while it still runs
	// them (a warm leave).
	mgrCtx, stop := context.WithCancel(context.WithoutCancel(signal))
	go func() { <-signal.Done(); rep.Leave(mgrCtx); stop() }()
	return mgr.Start(mgrCtx)
}

// digester writes a team ConfigMap's digest: read through its shard, the
// write asked of the shard.
type digester struct {
	shards sharding.Shards
	c      client.Client
}

func (d *digester) Reconcile(ctx context.Context, req sharding.Request) (reconcile.Result, error) {
	reader, ok := d.shards.Reader(req.Shard)
	if !ok {
		return reconcile.Result{}, nil
	}
	var cm corev1.ConfigMap
	if err := reader.Get(ctx, req.NamespacedName, &cm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	digest := digestOf(cm.Data)
	if cm.Annotations[digestAnnotation] == digest {
		return reconcile.Result{}, nil
	}
	wctx, done, ok := d.shards.WriteContext(ctx, req.Shard)
	defer done()
	if !ok {
		return reconcile.Result{}, nil // the shard moved: its holder writes it
	}
	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[digestAnnotation] = digest
	return reconcile.Result{}, d.c.Patch(wctx, &cm, patch)
}

// digestOf is the SHA-256 of data's keys and values, in key order.
func digestOf(data map[string]string) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(data)) {
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(data[k]), data[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}
