package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// TestMeasureFootprint measures what one replica costs as the objects it
// holds grow, for the sizing of deploy/base and the HPA target in
// deploy/README.md. It runs the real binary as the deploy's ServiceAccount,
// holding all 64 shards, and reads its own metrics before and after N
// ConfigBindings (2 keys each, over 100 domains) are Ready. It asserts only
// that they all become Ready; the numbers are logged:
//
//	KSHARD_MEASURE_FOOTPRINT=5000 go test -run TestMeasureFootprint -v ./deploy/
func TestMeasureFootprint(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KSHARD_MEASURE_FOOTPRINT"))
	if n <= 0 {
		t.Skip("set KSHARD_MEASURE_FOOTPRINT to a number of ConfigBindings to measure")
	}
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c)
	const domains = 100
	cc, err := configcenter.Start(ctx, configcenter.Options{Seed: configcenter.SeedOptions{Domains: domains, KeysPerDomain: 4, ValueBytes: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	kshard, metricsAddr := runReplica(ctx, t, ns, cc.URL())
	scraper := bindMetricsReader(ctx, t, c, ns)

	sample := func() map[string]float64 {
		t.Helper()
		var out map[string]float64
		controlplane.Eventually(t, time.Minute, "metrics", func() error {
			code, body, err := scrape(metricsAddr, scraper)
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("/metrics: %d", code)
			}
			out = map[string]float64{}
			for _, line := range strings.Split(body, "\n") {
				name, value, ok := strings.Cut(line, " ")
				if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
					continue
				}
				if v, err := strconv.ParseFloat(value, 64); err == nil {
					out[name] = v
				}
			}
			return nil
		})
		return out
	}
	before := sample()

	app := uniqueName("footprint")
	createNamespace(ctx, t, c, app, nil)
	start := time.Now()
	for i := range n {
		cb := &configv1alpha1.ConfigBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: app, Name: fmt.Sprintf("cb-%d", i)},
			Spec: configv1alpha1.ConfigBindingSpec{
				Domain: fmt.Sprintf("domain-%d", i%domains),
				Keys:   []configv1alpha1.ConfigKey{"key-0", "key-1"},
				Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: fmt.Sprintf("cb-%d", i)},
			},
		}
		if err := c.Create(ctx, cb); err != nil {
			t.Fatal(err)
		}
	}
	controlplane.Eventually(t, 15*time.Minute, "every ConfigBinding Ready", func() error {
		var list configv1alpha1.ConfigBindingList
		if err := c.List(ctx, &list, client.InNamespace(app)); err != nil {
			return err
		}
		ready := 0
		for _, cb := range list.Items {
			if meta.IsStatusConditionTrue(cb.Status.Conditions, configbinding.ConditionReady) {
				ready++
			}
		}
		if ready != n {
			return fmt.Errorf("%d of %d Ready", ready, n)
		}
		return nil
	})
	took := time.Since(start)
	after := sample()
	mib := func(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
	for _, m := range []string{"process_resident_memory_bytes", "go_memstats_heap_inuse_bytes", "kshard_externalcache_bytes"} {
		t.Logf("%-32s %12s empty, %12s with %d objects: %.1f KiB per object", m, mib(before[m]), mib(after[m]), n, (after[m]-before[m])/float64(n)/1024)
	}
	t.Logf("shards held %v; %d objects created and Ready in %s (one replica, its CPU shared with the API server)", after["kshard_shards_owned"], n, took.Round(time.Second))
	kshard.stop(t, 2*time.Minute)
}
