package loadtest

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/sharding"
)

func TestCeilingRate(t *testing.T) {
	// The patches in flight at the end of the calibration count, and so
	// does the time they took: 6,170 patches answered 5 s after the first.
	if got := ceilingRate(6170, 5*time.Second); got != 1234 {
		t.Errorf("ceiling = %v, want 1234 writes/s", got)
	}
	if got := ceilingRate(10, 0); got != 0 {
		t.Errorf("ceiling over no time = %v, want 0 (not measured)", got)
	}
	var off *Calibration
	if off.measured() || (&Calibration{WritesPerSec: 1000, Error: "boom"}).measured() || !(&Calibration{WritesPerSec: 1}).measured() {
		t.Error("measured(): a nil or failed calibration has no ceiling; one with a rate has")
	}
}

func TestStormOfStart(t *testing.T) {
	ev := EventResult{Reconciled: 40 * time.Second, WritesCounted: true, ObjectWrites: 15000, OwnWrites: 0}
	s := stormOfStart(ev, time.Time{}, 5000)
	if s.Kind != stormStart || s.Objects != 5000 || s.Duration != 40*time.Second || !s.Settled || !s.WritesCounted || s.Writes != 15000 {
		t.Fatalf("storm of a start = %+v", s)
	}
	if f := s.figures(750); f.ReadyPerSec != 125 || f.WritesPerSec != 375 || f.OfCeiling != 0.5 {
		t.Errorf("figures = %+v, want 125 Ready/s, 375 writes/s, half the ceiling", f)
	}
	ev.Error = "not settled after 5m"
	if s := stormOfStart(ev, time.Time{}, 5000); s.Settled {
		t.Error("a start that did not settle is not a settled storm")
	}
	// A fleet that started on no objects has its storm from the creates.
	if s := stormOfStart(ev, time.Time{}, 0); s.Kind != "" {
		t.Errorf("storm of a start on no objects = %+v, want none", s)
	}
}

func TestMovedToOther(t *testing.T) {
	before := map[int32]string{0: "kshard-2", 1: "kshard-2", 2: "kshard-1", 3: "kshard-0"}
	// A rolling restart done right: kshard-2 took its shards back.
	if n := movedToOther(before, map[int32]string{0: "kshard-2", 1: "kshard-2", 2: "kshard-1", 3: "kshard-0"}); n != 0 {
		t.Errorf("restart that kept every shard: %d moved, want 0", n)
	}
	// Shard 1 went to kshard-0 meanwhile; shard 3 is unowned when the
	// settle gave up, which is not a move to another replica.
	if n := movedToOther(before, map[int32]string{0: "kshard-2", 1: "kshard-0", 2: "kshard-1"}); n != 1 {
		t.Errorf("%d moved, want 1 (shard 1)", n)
	}
	// Nothing was held before (a fleet's start): nothing moved away.
	if n := movedToOther(map[int32]string{}, map[int32]string{0: "kshard-0"}); n != 0 {
		t.Errorf("%d moved from nobody, want 0", n)
	}
}

func TestHoldersAt(t *testing.T) {
	t0 := time.Now()
	w := &ringWatch{holderHistory: map[int32][]holderChange{
		0: {{t0, "kshard-0"}, {t0.Add(2 * time.Second), ""}, {t0.Add(3 * time.Second), "kshard-0"}},
		1: {{t0, ""}, {t0.Add(time.Second), "kshard-1"}},
	}}
	at := func(d time.Duration) map[int32]string { return w.holdersAt(t0.Add(d)) }
	if h := at(-time.Millisecond); len(h) != 0 {
		t.Errorf("before any tick: %v, want none", h)
	}
	// A change at exactly t counts: the tick saw it by then.
	if h := at(time.Second); h[0] != "kshard-0" || h[1] != "kshard-1" {
		t.Errorf("at 1s: %v", h)
	}
	// Right before a SIGTERM the holder still held; during the restart the
	// shard is absent (unowned), after it held again.
	if h := at(2500 * time.Millisecond); h[0] != "" || len(h) != 1 {
		t.Errorf("at 2.5s: %v, want only shard 1", h)
	}
	if h := at(time.Hour); h[0] != "kshard-0" {
		t.Errorf("at the end: %v", h)
	}
}

func TestLabelLatenciesPerFleet(t *testing.T) {
	tr := &tracker{shards: sharding.DefaultShards, objects: map[string]*objectState{}}
	t0 := time.Now()
	unlabeled := func(name string) *configv1alpha1.ConfigBinding {
		cb := binding(1, 0, false, "")
		cb.Name, cb.Labels = name, nil
		return cb
	}
	labeled := func(name string) *configv1alpha1.ConfigBinding {
		cb := binding(1, 0, false, "")
		cb.Name = name
		return cb
	}
	// a: created by the load tester (timed), labeled by the fleet.
	tr.wrote("ns/a", 1, t0.Add(-time.Hour), writeCreate)
	tr.observe(unlabeled("a"))
	// b: created before any fleet ran (not timed), seen unlabeled.
	tr.observe(unlabeled("b"))
	// c: found already labeled at the watch's start: no labeling seen.
	tr.observe(labeled("c"))
	tr.observe(labeled("a"))
	tr.observe(labeled("b"))
	now := time.Now()

	if h := tr.labelLatencies(); h.Count() != 1 || h.Max() < time.Hour {
		t.Errorf("create → labeled over the run: %d samples, max %s; want only a's, about an hour", h.Count(), h.Max())
	}
	// For a fleet that started 10 s before the labels showed, the clock of
	// b (and of a, created earlier still) starts at the fleet's start.
	from := now.Add(-10 * time.Second)
	h := tr.labelLatenciesBetween(from, now.Add(time.Second))
	if h.Count() != 2 {
		t.Fatalf("%d samples in the fleet, want a and b (not c)", h.Count())
	}
	if q := h.Quantile(1); q < 9*time.Second || q > 10*time.Second {
		t.Errorf("fleet start → labeled = %s, want just under 10s (the labels showed right before now)", q)
	}
	// Outside the fleet's life: none.
	if h := tr.labelLatenciesBetween(now.Add(time.Second), now.Add(time.Minute)); h.Count() != 0 {
		t.Errorf("%d samples after the labels showed", h.Count())
	}
}

func TestCalibrationStatus(t *testing.T) {
	a, err := calibrationStatus(1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := calibrationStatus(2)
	if string(a) == string(b) {
		t.Fatal("two calibration patches are equal: the API server would skip the second without writing")
	}
	var got struct {
		Status configv1alpha1.ConfigBindingStatus `json:"status"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	c := got.Status.Conditions
	// The CRD requires every field of a condition.
	if got.Status.ResolvedRevision != 2 || len(c) != 1 || c[0].Type != "Ready" || c[0].Reason == "" || c[0].Message == "" || c[0].LastTransitionTime == (metav1.Time{}) {
		t.Errorf("status patch %s", b)
	}
}

func TestCeilingText(t *testing.T) {
	cal := &Calibration{Duration: 5 * time.Second, Elapsed: 5 * time.Second, Workers: 64, Objects: 256, Patches: 6000, WritesPerSec: 1200,
		P50: 40 * time.Millisecond, P99: 120 * time.Millisecond}
	txt := ceilingText(cal)
	for _, want := range []string{"1200 writes/s", "64 workers", "6000 patches in 5s", "p99 120 ms", "400 created objects/s"} {
		if !strings.Contains(txt, want) {
			t.Errorf("%q lacks %q", txt, want)
		}
	}
	if txt := ceilingText(nil); !strings.Contains(txt, "--calibrate-for 0") {
		t.Errorf("off: %q", txt)
	}
	if txt := ceilingText(&Calibration{Error: "no status patch succeeded"}); !strings.Contains(txt, "not measured: no status patch succeeded") {
		t.Errorf("failed: %q", txt)
	}
}

func TestOverClaim(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int, objects float64) replicaSample {
		return replicaSample{At: t0.Add(time.Duration(s) * time.Second), Objects: objects}
	}
	samples := []replicaSample{at(-5, 900), at(1, 300), at(2, 900), at(3, 300), at(4, 300), at(20, 5000)}
	if r, ok := overClaim(samples, t0, t0.Add(4*time.Second)); !ok || r != 3 {
		t.Errorf("overClaim = %v, %v; want 3 (900 held on the way to a share of 300)", r, ok)
	}
	if r, ok := overClaim(samples[1:2], t0, t0.Add(4*time.Second)); !ok || r != 1 {
		t.Errorf("overClaim of a steady replica = %v, %v; want 1", r, ok)
	}
	if _, ok := overClaim([]replicaSample{at(1, 0)}, t0, t0.Add(4*time.Second)); ok {
		t.Error("a replica holding nothing at the end has no share to compare with")
	}
}

// TestServerCPUPerWrite: a storm's API server CPU per controller write is
// the server's cores between the samples inside the storm over the storm's
// write rate; without two samples of one process inside it, or without
// counted writes, there is none.
func TestServerCPUPerWrite(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sample := func(sec, cpu float64, pid int) controlPlaneSample {
		return controlPlaneSample{At: t0.Add(time.Duration(sec * float64(time.Second))), APIServerCPU: cpu, EtcdCPU: 0, APIServerPID: pid}
	}
	// 1.5 cores from 1 s to 9 s; the samples outside the storm do not count.
	r := &run{controlPlane: []controlPlaneSample{sample(-1, 0, 1), sample(1, 10, 1), sample(9, 22, 1), sample(11, 100, 1)}}
	storm := CreateStorm{Kind: stormStart, Objects: 1000, Duration: 10 * time.Second, Settled: true, WritesCounted: true, Writes: 3000}
	// 300 writes/s at 1.5 cores: 5 ms per write.
	if got := r.withServerCPU(storm, t0).ServerCPUPerWrite; math.Abs(got-0.005) > 1e-9 {
		t.Errorf("CPU per write %v s, want 0.005", got)
	}
	for name, c := range map[string]struct {
		r *run
		s CreateStorm
	}{
		"no writes counted": {r, CreateStorm{Kind: stormStart, Objects: 1000, Duration: 10 * time.Second}},
		"one sample":        {&run{controlPlane: []controlPlaneSample{sample(1, 10, 1)}}, storm},
		"a restart between": {&run{controlPlane: []controlPlaneSample{sample(1, 10, 1), sample(9, 2, 2)}}, storm},
	} {
		if got := c.r.withServerCPU(c.s, t0).ServerCPUPerWrite; got != 0 {
			t.Errorf("%s: CPU per write %v, want none (0)", name, got)
		}
	}
}
