package deploy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
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
// that they all become Ready; the numbers are logged, with the live heap
// (a heap profile after a forced GC, without the garbage heap_inuse counts):
//
//	KSHARD_MEASURE_FOOTPRINT=5000 go test -run TestMeasureFootprint -v ./deploy/
//
// KSHARD_FOOTPRINT_PROFILE=FILE also keeps the profile with the objects in
// FILE and the one before them in FILE.empty, for
// `go tool pprof -top -sample_index=inuse_space -diff_base FILE.empty FILE`:
// what the objects cost, by allocation site.
func TestMeasureFootprint(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KSHARD_MEASURE_FOOTPRINT"))
	if n <= 0 {
		t.Skip("set KSHARD_MEASURE_FOOTPRINT to a number of ConfigBindings to measure")
	}
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c)
	const domains = 100
	cc := startConfigCenter(ctx, t, configcenter.SeedOptions{Domains: domains, KeysPerDomain: 4, ValueBytes: 64})
	pprofAddr := controlplane.FreeAddr(t)
	kshard, metrics := runReplica(ctx, t, ns, cc.Endpoint(), "--pprof-bind-address", pprofAddr)
	scraper := bindMetricsReader(ctx, t, c, ns)

	sample := func() map[string]float64 {
		t.Helper()
		var out map[string]float64
		controlplane.Eventually(t, time.Minute, "metrics", func() error {
			code, body, err := metrics.scrape(scraper)
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
	keep := os.Getenv("KSHARD_FOOTPRINT_PROFILE")
	keepEmpty := ""
	if keep != "" {
		keepEmpty = keep + ".empty"
	}
	liveBefore := liveHeap(t, pprofAddr, keepEmpty)

	app := uniqueName("footprint")
	createNamespace(ctx, t, c, app, targets)
	start := time.Now()
	createBindings(ctx, t, c, app, n, domains)
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
	liveAfter := liveHeap(t, pprofAddr, keep)
	t.Logf("%-32s %12s empty, %12s with %d objects: %.1f KiB per object", "live heap (profile after GC)",
		fmt.Sprintf("%.1f MiB", float64(liveBefore)/(1<<20)), fmt.Sprintf("%.1f MiB", float64(liveAfter)/(1<<20)), n,
		float64(liveAfter-liveBefore)/float64(n)/1024)
	mib := func(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
	for _, m := range []string{"process_resident_memory_bytes", "go_memstats_heap_inuse_bytes", "kshard_externalcache_bytes"} {
		t.Logf("%-32s %12s empty, %12s with %d objects: %.1f KiB per object", m, mib(before[m]), mib(after[m]), n, (after[m]-before[m])/float64(n)/1024)
	}
	t.Logf("shards held %v; %d objects created and Ready in %s (one replica, its CPU shared with the API server)", after["kshard_shards_owned"], n, took.Round(time.Second))
	kshard.stop(t, 2*time.Minute)
}

// liveHeap forces a GC in the replica and returns its HeapAlloc then (the
// live heap, without the garbage heap_inuse counts), from the text heap
// profile's MemStats; the binary profile is kept in keep when it is not
// empty.
func liveHeap(t *testing.T, pprofAddr, keep string) int64 {
	t.Helper()
	get := func(query string) []byte {
		resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/heap?" + query)
		if err != nil {
			t.Fatalf("reading the heap profile: %v", err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the heap profile: %v", err)
		}
		return raw
	}
	for _, line := range strings.Split(string(get("gc=1&debug=1")), "\n") {
		if v, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("parsing HeapAlloc %q: %v", v, err)
			}
			if keep != "" {
				if err := os.WriteFile(keep, get("gc=1"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			return n
		}
	}
	t.Fatal("the heap profile has no HeapAlloc")
	return 0
}
