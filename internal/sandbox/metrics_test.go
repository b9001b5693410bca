package sandbox

import (
	"strings"
	"testing"
	"time"
)

// A replica's /metrics as controller-runtime serves it, trimmed.
const metricsText = `# HELP controller_runtime_reconcile_total Total number of reconciliations per controller
# TYPE controller_runtime_reconcile_total counter
controller_runtime_reconcile_total{controller="configbinding",result="error"} 2
controller_runtime_reconcile_total{controller="configbinding",result="requeue"} 0
controller_runtime_reconcile_total{controller="configbinding",result="success"} 40
controller_runtime_reconcile_total{controller="labeler",result="success"} 8
# HELP kshard_external_calls_total Fetch calls made to the external service, by code.
# TYPE kshard_external_calls_total counter
kshard_external_calls_total{code="ok"} 30
kshard_external_calls_total{code="503"} 5
# HELP kshard_externalcache_requests_total Cache lookups by result.
# TYPE kshard_externalcache_requests_total counter
kshard_externalcache_requests_total{result="hit"} 60
kshard_externalcache_requests_total{result="miss"} 20
kshard_externalcache_requests_total{result="negative"} 0
kshard_externalcache_requests_total{result="stale"} 20
# HELP kshard_shard_objects Primary objects in the informer cache of each shard this replica holds.
# TYPE kshard_shard_objects gauge
kshard_shard_objects{shard="3"} 10
kshard_shard_objects{shard="17"} 30
# HELP kshard_shards_owned Shards this replica holds the Lease of and runs.
# TYPE kshard_shards_owned gauge
kshard_shards_owned 21
`

func TestParseMetrics(t *testing.T) {
	s, err := parseMetrics(strings.NewReader(metricsText))
	if err != nil {
		t.Fatal(err)
	}
	if s.shards != 21 || s.objects != 40 || s.reconciles != 50 || s.externalCalls != 35 {
		t.Errorf("parsed %+v", s)
	}
	if r, ok := s.cacheHitRatio(); !ok || r != 0.8 {
		t.Errorf("cache hit ratio = %v, %v; want 0.8 (hit and stale over all lookups)", r, ok)
	}

	// A replica that has not served anything yet has no families at all.
	empty, err := parseMetrics(strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := empty.cacheHitRatio(); ok || empty.reconciles != 0 {
		t.Errorf("empty metrics parsed as %+v", empty)
	}
}

func TestReconcileRate(t *testing.T) {
	t0 := time.Now()
	prev := sample{at: t0, reconciles: 100}
	if r, ok := reconcileRate(prev, sample{at: t0.Add(2 * time.Second), reconciles: 110}); !ok || r != 5 {
		t.Errorf("rate = %v, %v; want 5/s", r, ok)
	}
	// A counter that went down restarted: everything it has is new.
	if r, ok := reconcileRate(prev, sample{at: t0.Add(2 * time.Second), reconciles: 4}); !ok || r != 2 {
		t.Errorf("rate after a reset = %v, %v; want 2/s", r, ok)
	}
	if _, ok := reconcileRate(sample{}, sample{at: t0, reconciles: 4}); ok {
		t.Error("a rate without a previous sample")
	}
}
