package loadtest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/sharding"
)

// TestChecksWithoutDataFail: a check with nothing to decide on fails as
// "no data" instead of passing vacuously, and the report says so in its
// result cell; a check about something the run did not have passes as n/a.
func TestChecksWithoutDataFail(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	noData := map[string]Check{
		"ready":      readyCheck(0, 0, nil),
		"unowned":    unownedCheck(nil, 0, 20*time.Second, t0, nil),
		"events":     eventsCheck(nil, 5*time.Minute),
		"reconciles": (&AuditSummary{Processes: 3}).reconcileCheck(""),
		"writes":     (*WriteEvidence)(nil).check(""),
		"memory":     memoryCheck([]*FleetResult{{Fleet: "sharded ×3", MemoryLimit: 512 << 20}}, nil),
	}
	rep := &Report{Scenario: "basic"}
	for name, c := range noData {
		if c.Passed || !c.NoData || !strings.HasPrefix(c.Detail, "no data: ") {
			t.Errorf("%s without data: %+v, want a failure saying no data", name, c)
		}
		rep.Checks = append(rep.Checks, c)
	}
	if c := noData["memory"]; !strings.Contains(c.Detail, "sharded ×3") {
		t.Errorf("memory check %q: want the fleet without a measurement named", c.Detail)
	}
	md := renderMarkdown(rep)
	for _, c := range rep.Checks {
		if want := "| " + mdEscape(c.Name) + " | **FAIL** (no data) | no data: "; !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(md, "| pass |") {
		t.Error("a check without data reported as passed")
	}

	// With data they decide as before.
	for name, c := range map[string]Check{
		"ready":      readyCheck(0, 10, nil),
		"unowned":    unownedCheck(nil, 50, 20*time.Second, t0, nil),
		"events":     eventsCheck([]EventResult{{Name: "start of sharded ×3"}}, 5*time.Minute),
		"reconciles": (&AuditSummary{Records: 20, Processes: 3, Objects: 10}).reconcileCheck(""),
	} {
		if !c.Passed || c.NoData {
			t.Errorf("%s with data: %+v, want a pass", name, c)
		}
	}
	if c := readyCheck(1, 10, []string{"ns/x"}); c.Passed || c.NoData {
		t.Errorf("one object not Ready: %+v, want a failure on data", c)
	}

	na := memoryCheck([]*FleetResult{{Fleet: "plain controller-runtime ×1", Plain: true}}, nil)
	if !na.Passed || !na.NotApplicable || na.result() != "n/a" {
		t.Errorf("no memory limit: %+v (%s), want n/a", na, na.result())
	}
}

// TestEmptyResultsSayNoData: a fleet whose replicas were never scraped,
// with no update measured, no config-center or load sample and no API
// server reading at its end, computed as a run computes it, renders every
// figure it has no data for as "no data": never a p99 of 0, a 0 ms, a 100 %
// or a 0 B read as a measurement.
func TestEmptyResultsSayNoData(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &run{opts: Options{MemoryLimit: "512Mi"}, tracker: &tracker{shards: sharding.DefaultShards, objects: map[string]*objectState{}}}
	f := &fleet{mode: ModeSharded, sizes: []int{2}, started: t0, stopped: t0.Add(time.Minute), loadFrom: t0.Add(10 * time.Second), loadTo: t0.Add(50 * time.Second),
		apiStart: apiServerSample{At: t0}, startEvent: EventResult{Name: "start of sharded ×2"},
		slots: []*slot{
			{id: "kshard-0", instances: []*instance{{proc: &container{done: make(chan struct{})}}}},
			{id: "kshard-1", instances: []*instance{{proc: &container{done: make(chan struct{})}}}},
		}}
	res := r.fleetResult(f)
	base := *res
	base.Fleet, base.Mode, base.Args = "sharding off ×1", ModeSingleton.Name, ModeSingleton.Args
	empty := summarize(&histogram{})
	rep := &Report{Scenario: "basic", Machine: Machine{LoadMean: -1, LoadMax: -1}, Updates: empty, Creates: empty, Labeled: empty,
		Fleets: []*FleetResult{res, &base}}
	md := renderMarkdown(rep)

	for _, want := range []string{
		"its 1-minute load average was no data (not sampled) during the run",
		"| spec updates | 0 | no data | no data | no data | no data | no data | no data |",
		"| creates | 0 | no data | no data | no data | no data | no data | no data |",
		"| 25 ms | 0 | no data |",
		"| machine load average in the phase, mean / peak (0 CPUs) | no data | no data |",
		"| heap in use per replica, peak (largest) | no data | no data |",
		"| largest peak heap ÷ sharded ×2's | no data | no data |",
		"| RSS per replica, peak (largest) | no data | no data |",
		"| peak resident memory ÷ memory limit (largest replica) | no data ÷ 512.0 MiB | no data ÷ 512.0 MiB |",
		"| ConfigBindings held per replica, peak (largest) | no data | all (one cache of every object) |",
		"| initial syncs of ConfigBindings: LISTs + watch-lists (API server) | no data | no data |",
		"| informer caches the replicas started (kshard_caches_started_total): for acquisitions, of shards acquired | no data | — |",
		"| ConfigBindings scanned for initial syncs ÷ singleton's | no data | no data |",
		"| end-to-end p99 | no data | no data |",
		"| updates Ready within 1 s / 5 s | no data | no data |",
		"| updates offered per second | 0.0 | 0.0 |", // the load tester's own count: it sent none
		"| throughput: generations Ready per second | no data | no data |",
		"| reconciles per second | no data | no data |",
		"| replicas' CPU in the phase, all replicas (cores) | no data | no data |",
		"| reconcile p99 (controller-runtime histogram) | no data | no data |",
		"| config-center key reads in the phase | no data | no data |",
		"| … per spec update | no data | no data |",
		"| external-cache hit ratio (fresh or stale) | no data (no lookups) | no data (no lookups) |",
		"| Lease writes per second (API server) | no data | no data |",
		"| controller API writes per spec update | no data | no data |",
		"| sharded ×2 | kshard-0 | 1 | no data | no data | no data | no data | no data | no data | no data |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	for _, bad := range []string{"p99 0", " 0 ms", "100.0 %", "0.0 %", "0 B", "| 0.00 |", "0.0 / 0.0"} {
		if strings.Contains(md, bad) {
			t.Errorf("the report says %q for a figure without data:\n%s", bad, md)
		}
	}
	js, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"WithinSLO":-1`) {
		t.Errorf("an empty latency summary's shares must be -1 in the JSON, not 1: %s", js)
	}
}

// TestMissingFamiliesAreNoData: a metric family no scrape had is told from
// one at 0 — -1 in a sample, no figure in the fleet's result, "no data" in
// the report — so neither the report nor a test comparing the counts reads
// 0 for a metric the replicas never exported; and an API server scrape
// without apiserver_request_total is an error rather than 0 writes.
func TestMissingFamiliesAreNoData(t *testing.T) {
	parse := func(text string) families {
		t.Helper()
		f, err := parseFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	const process = "# TYPE go_memstats_heap_inuse_bytes gauge\ngo_memstats_heap_inuse_bytes 1e+07\n" +
		"# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 3e+07\n"
	const kshard = "# TYPE go_gc_heap_live_bytes gauge\ngo_gc_heap_live_bytes 0\n" +
		"# TYPE kshard_shards_owned gauge\nkshard_shards_owned{ring=\"r\"} 0\n" +
		"# TYPE kshard_unlabeled_objects gauge\nkshard_unlabeled_objects{ring=\"r\"} 0\n" +
		"# TYPE kshard_shard_objects gauge\nkshard_shard_objects{ring=\"r\",shard=\"3\"} 0\n" +
		"# TYPE kshard_caches_started_total counter\nkshard_caches_started_total{ring=\"r\",reason=\"acquisition\"} 0\n" +
		"# TYPE kshard_shard_handovers_total counter\nkshard_shard_handovers_total{ring=\"r\",direction=\"acquire\",reason=\"x\"} 0\n"

	missing := replicaSampleOf(parse(process), "")
	if missing.Objects != -1 || missing.Shards != -1 || missing.Unlabeled != -1 || missing.Acquired != -1 || missing.Caches != nil || missing.HeapLive != -1 {
		t.Errorf("kshard families missing: %+v, want -1 and nil", missing)
	}
	zero := replicaSampleOf(parse(process+kshard), "")
	if zero.Objects != 0 || zero.Shards != 0 || zero.Unlabeled != 0 || zero.Acquired != 0 || zero.Caches == nil || zero.HeapLive != 0 {
		t.Errorf("kshard families at 0: %+v, want 0 and a map", zero)
	}

	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	result := func(s replicaSample) *FleetResult {
		s.At = t0.Add(30 * time.Second)
		r := &run{opts: Options{MemoryLimit: "512Mi"}, tracker: &tracker{shards: sharding.DefaultShards, objects: map[string]*objectState{}}}
		return r.fleetResult(&fleet{mode: ModeSharded, sizes: []int{1}, started: t0, stopped: t0.Add(time.Minute),
			slots: []*slot{{id: "kshard-0", instances: []*instance{{proc: &container{done: make(chan struct{})}, samples: []replicaSample{s}}}}}})
	}
	res := result(missing)
	if res.HeapLivePeakMax != 0 || res.HeapLiveEndSum != 0 {
		t.Errorf("a fleet whose scrapes lacked the live heap: peak %v, fleet at the end %v; want 0 (no data)", res.HeapLivePeakMax, res.HeapLiveEndSum)
	}
	if res.HeldMax != -1 || res.CachesStarted != -1 || res.AcquisitionCaches != -1 || res.Acquisitions != -1 || res.UnlabeledPeak != -1 {
		t.Errorf("a fleet whose scrapes lacked them: held %v, caches %v (%v for acquisitions, of %v), unlabeled %v; want -1 each",
			res.HeldMax, res.CachesStarted, res.AcquisitionCaches, res.Acquisitions, res.UnlabeledPeak)
	}
	md := renderMarkdown(&Report{Scenario: "basic", Fleets: []*FleetResult{res}})
	for _, want := range []string{
		"| ConfigBindings held per replica, peak (largest) | no data |",
		"| informer caches the replicas started (kshard_caches_started_total): for acquisitions, of shards acquired | no data |",
		"| objects waiting for a label, peak | no data (not sampled) |",
		"| sharded ×1 | kshard-0 | 1 | 9.5 MiB | 9.5 MiB | 28.6 MiB | no data | no data | 0 | no data |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if res := result(zero); res.HeldMax != 0 || res.CachesStarted != 0 || res.Acquisitions != 0 || res.UnlabeledPeak != 0 {
		t.Errorf("a fleet whose scrapes had them at 0: held %v, caches %v, acquisitions %v, unlabeled %v; want 0 each",
			res.HeldMax, res.CachesStarted, res.Acquisitions, res.UnlabeledPeak)
	}

	if _, err := apiSampleOf(parse(process)); err == nil || !strings.Contains(err.Error(), metricAPIRequests) {
		t.Errorf("an API server scrape without %s: %v, want an error naming it", metricAPIRequests, err)
	}
}
