package sharding_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/promtext"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/ring"
)

// TestMeasureShardSelector evaluates server-side sharded list and watch
// (KEP-5866: the ShardedListAndWatch gate, alpha since Kubernetes 1.36)
// against kshard's label selector, on an API server with the gate on. N
// ConfigBindings are spread over 100 namespaces, one business domain per
// namespace; four replicas each take a quarter, once by
// `kshard.dev/shard in (…)` (the ring's shards) and once by
// shardRange(object.metadata.namespace, …) (a quarter of the hash space),
// each by LIST and by watch-list. The API server's own counters say what
// each costs it. It asserts only that the four quarters of the shard
// selector cover every object once; it is skipped unless
// KSHARD_MEASURE_SHARD_SELECTOR is set to the object count:
//
//	KSHARD_MEASURE_SHARD_SELECTOR=5000 go test -run TestMeasureShardSelector -v ./sharding/
func TestMeasureShardSelector(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KSHARD_MEASURE_SHARD_SELECTOR"))
	if n <= 0 {
		t.Skip("set KSHARD_MEASURE_SHARD_SELECTOR=<objects> to measure")
	}
	gated, err := controlplane.Start(controlplane.Options{
		APIServerArgs: map[string][]string{"feature-gates": {"ShardedListAndWatch=true"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gated.Stop() })
	ctx := context.Background()
	c, err := client.New(gated.Config, client.Options{Scheme: newScheme()})
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(gated.Config)

	const namespaces = 100
	for i := range namespaces {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("domain-%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				domain := fmt.Sprintf("domain-%d", i%namespaces)
				cb := &configv1alpha1.ConfigBinding{
					ObjectMeta: metav1.ObjectMeta{Namespace: domain, Name: fmt.Sprintf("cb-%d", i), Labels: map[string]string{
						sharding.LabelShard: strconv.Itoa(int(sharding.ShardOf(domain, fullShards))),
					}},
					Spec: configv1alpha1.ConfigBindingSpec{
						Domain: domain, Keys: []configv1alpha1.ConfigKey{"key-0"},
						Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: fmt.Sprintf("cb-%d", i)},
					},
				}
				if err := c.Create(ctx, cb); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	gvr := schema.GroupVersionResource{Group: configv1alpha1.GroupVersion.Group, Version: configv1alpha1.GroupVersion.Version, Resource: "configbindings"}
	members := []string{"r-0", "r-1", "r-2", "r-3"}
	ringName := ring.New(fullShards, members)
	labelOpts := make([]metav1.ListOptions, len(members))
	shardOpts := make([]metav1.ListOptions, len(members))
	for i, m := range members {
		values := make([]string, 0, fullShards)
		for _, s := range ringName.ShardsOf(m) {
			values = append(values, strconv.Itoa(int(s)))
		}
		labelOpts[i] = metav1.ListOptions{LabelSelector: sharding.LabelShard + " in (" + strings.Join(values, ",") + ")"}
		lo, hi := uint64(i)<<62, "0x10000000000000000"
		if i < len(members)-1 {
			hi = fmt.Sprintf("0x%016x", uint64(i+1)<<62)
		}
		shardOpts[i] = metav1.ListOptions{ShardSelector: fmt.Sprintf("shardRange(object.metadata.namespace, '0x%016x', '%s')", lo, hi)}
	}

	type cost struct{ requests, scanned, returned, items, bytes float64 }
	measure := func(opts []metav1.ListOptions, watchList bool) (cost, []string) {
		before := apiCounts(t, gated)
		var got cost
		var names []string
		echoed := 0
		for _, o := range opts {
			if watchList {
				o.SendInitialEvents = ptr.To(true)
				o.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
				o.AllowWatchBookmarks = true
				w, err := dyn.Resource(gvr).Watch(ctx, o)
				if err != nil {
					t.Fatalf("watch-list %+v: %v", o, err)
				}
				for ev := range w.ResultChan() {
					u, ok := ev.Object.(*unstructured.Unstructured)
					if !ok {
						t.Fatalf("watch-list event %v: %T", ev.Type, ev.Object)
					}
					if ev.Type == watch.Bookmark {
						if u.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true" {
							break
						}
						continue
					}
					names = append(names, u.GetNamespace()+"/"+u.GetName())
				}
				w.Stop()
				continue
			}
			list, err := dyn.Resource(gvr).List(ctx, o)
			if err != nil {
				t.Fatalf("list %+v: %v", o, err)
			}
			if _, found, _ := unstructured.NestedMap(list.Object, "metadata", "shardInfo"); found {
				echoed++
			}
			for _, u := range list.Items {
				names = append(names, u.GetNamespace()+"/"+u.GetName())
			}
		}
		time.Sleep(time.Second) // the counters of a finished watch settle
		after := apiCounts(t, gated)
		got.requests = after.requests - before.requests
		got.scanned = after.scanned - before.scanned
		got.returned = after.returned - before.returned
		got.bytes = after.bytes - before.bytes
		got.items = float64(len(names))
		if opts[0].ShardSelector != "" && !watchList && echoed != len(opts) {
			t.Logf("the server echoed shardInfo on %d of %d lists", echoed, len(opts))
		}
		return got, names
	}
	report := func(what string, c cost) {
		t.Logf("%-44s %3.0f syncs, %7.0f objects scanned (%.2f× the objects), %6.0f returned to clients, %.1f MiB sent",
			what, c.requests, c.scanned, c.scanned/float64(n), c.items, c.bytes/(1<<20))
	}
	for _, watchList := range []bool{false, true} {
		kind := "LIST"
		if watchList {
			kind = "watch-list"
		}
		byLabel, labelNames := measure(labelOpts, watchList)
		byShard, shardNames := measure(shardOpts, watchList)
		report(kind+", label selector (4 replicas)", byLabel)
		report(kind+", shardRange on the namespace (4 replicas)", byShard)
		for _, names := range [][]string{labelNames, shardNames} {
			seen := map[string]int{}
			for _, name := range names {
				seen[name]++
			}
			if len(seen) != n || len(names) != n {
				t.Errorf("%s: the four quarters returned %d objects, %d distinct, want each of %d once", kind, len(names), len(seen), n)
			}
		}
	}
}

// apiCounts is what an API server counted for ConfigBindings so far:
// initial syncs (LISTs and watch-lists), objects scanned for them, objects
// returned by LISTs, and bytes sent (LIST responses and watch events).
func apiCounts(t *testing.T, server *controlplane.ControlPlane) (c struct{ requests, scanned, returned, bytes float64 }) {
	t.Helper()
	fams, err := server.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for name, fam := range fams {
		for _, m := range fam.GetMetric() {
			if promtext.Label(m, "resource") != "configbindings" {
				continue
			}
			verb := promtext.Label(m, "verb")
			switch name {
			case "apiserver_request_total":
				if verb == "LIST" {
					c.requests += promtext.Value(m)
				}
			case "apiserver_watch_list_duration_seconds":
				c.requests += float64(m.GetHistogram().GetSampleCount())
			case "apiserver_storage_list_fetched_objects_total", "apiserver_init_events_total":
				c.scanned += promtext.Value(m)
			case "apiserver_storage_list_returned_objects_total":
				c.returned += promtext.Value(m)
			case "apiserver_response_sizes":
				if verb == "LIST" {
					c.bytes += m.GetHistogram().GetSampleSum()
				}
			case "apiserver_watch_events_sizes":
				c.bytes += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return c
}
