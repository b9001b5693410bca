package deploy_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/promtext"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// TestMeasureConfigMapScope measures what it would cost a replica to read
// ConfigMaps only in the namespaces that opted in (kshard.dev/targets), as
// the API server counts it: an informer of kshard's ConfigMaps per namespace
// (what a cache limited to those namespaces runs; RBAC could then grant
// reads per namespace) against the one cluster-wide informer a replica's
// shard group runs today, both selecting kshard's managed ConfigMaps.
// Counted: the LISTs the API server served and the objects it listed or
// walked for a watch's initial events (one watch per informer, by
// construction: one per namespace against one). Run with the number of opted-in namespaces:
//
//	KSHARD_MEASURE_CONFIGMAP_SCOPE=100 go test -run TestMeasureConfigMapScope -v ./deploy/
func TestMeasureConfigMapScope(t *testing.T) {
	k, _ := strconv.Atoi(os.Getenv("KSHARD_MEASURE_CONFIGMAP_SCOPE"))
	if k <= 0 {
		t.Skip("set KSHARD_MEASURE_CONFIGMAP_SCOPE to a number of opted-in namespaces to measure")
	}
	ctx := context.Background()
	c := adminClient(t)
	const perNamespace = 20
	var namespaces []string
	for i := range k {
		ns := uniqueName(fmt.Sprintf("scope-%d", i))
		createNamespace(ctx, t, c, ns, targets)
		namespaces = append(namespaces, ns)
		for j := range perNamespace {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cm-%d", j),
				Labels: map[string]string{configbinding.LabelManagedBy: configbinding.FieldManager}}}
			if err := c.Create(ctx, cm); err != nil {
				t.Fatal(err)
			}
		}
	}
	// An informer's initial sync is a watch that sends the current
	// objects first (client-go's WatchList), counted in init events; a LIST
	// where the server does not stream them.
	lists := func() (requests, objects float64) {
		requests = apiServerCount(ctx, t, "apiserver_request_total", func(m *dto.Metric) bool {
			return promtext.Label(m, "verb") == "LIST" && promtext.Label(m, "resource") == "configmaps"
		})
		resource := func(m *dto.Metric) bool { return promtext.Label(m, "resource") == "configmaps" }
		objects = apiServerCount(ctx, t, "apiserver_storage_list_fetched_objects_total", resource) +
			apiServerCount(ctx, t, "apiserver_init_events_total", resource)
		return requests, objects
	}
	// sync starts a cache of kshard's ConfigMaps and returns how many it
	// holds once synced; cancel stops it.
	sync := func(opts cache.Options) (n int, cancel context.CancelFunc) {
		t.Helper()
		opts.Scheme = replica.Scheme()
		opts.DefaultLabelSelector = configbinding.OwnedConfigMaps()
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		cc, err := cache.New(cp.Config, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cc.GetInformer(cctx, &corev1.ConfigMap{}); err != nil {
			t.Fatal(err)
		}
		go func() { _ = cc.Start(cctx) }()
		if !cc.WaitForCacheSync(cctx) {
			t.Fatal("cache not synced")
		}
		var got corev1.ConfigMapList
		if err := cc.List(cctx, &got, client.MatchingLabelsSelector{Selector: labels.Everything()}); err != nil {
			t.Fatal(err)
		}
		return len(got.Items), cancel
	}
	// The API server exports its count of initial events once it has
	// sent some.
	_, stop := sync(cache.Options{DefaultNamespaces: map[string]cache.Config{namespaces[0]: {}}})
	stop()
	measure := func(name string, opts cache.Options) {
		t.Helper()
		r0, o0 := lists()
		n, stop := sync(opts)
		defer stop()
		r1, o1 := lists()
		t.Logf("%s: %d ConfigMaps cached; the API server: %.0f LISTs, %.0f objects listed or walked for initial events",
			name, n, r1-r0, o1-o0)
	}
	byNamespace := map[string]cache.Config{}
	for _, ns := range namespaces {
		byNamespace[ns] = cache.Config{}
	}
	measure("cluster-wide (today)", cache.Options{})
	measure(fmt.Sprintf("one informer per opted-in namespace (%d)", k), cache.Options{DefaultNamespaces: byNamespace})
}
