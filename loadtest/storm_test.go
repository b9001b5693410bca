package loadtest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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
	ev := EventResult{Reconciled: 40 * time.Second}
	began := time.Now()
	s := stormOfStart(ev, began, 5000)
	if s.Kind != stormStart || s.Objects != 5000 || s.Duration != 40*time.Second || !s.Settled || !s.Began.Equal(began) {
		t.Fatalf("storm of a start = %+v", s)
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
	o := testObservations(t)
	tr := &tracker{shards: sharding.DefaultShards, objects: map[string]*objectState{}, obs: o}
	t0 := time.Now()
	// The fleet started 10 s before the labels showed.
	o.setFleet("fleet-1", t0.Add(-10*time.Second))
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
	// a: created by the load tester an hour before the fleet, labeled by it.
	tr.wrote("ns/a", 1, t0.Add(-time.Hour), writeCreate)
	tr.observe(unlabeled("a"))
	// b: created before any fleet ran (not timed), seen unlabeled.
	tr.observe(unlabeled("b"))
	// c: found already labeled at the watch's start: no labeling seen.
	tr.observe(labeled("c"))
	tr.observe(labeled("a"))
	tr.observe(labeled("b"))

	// Both clocks start at the fleet's start: the objects waited for a
	// labeler to exist, not for one to keep up.
	var m dto.Metric
	if err := o.labeled.WithLabelValues("fleet-1").(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 2 {
		t.Fatalf("%d labels observed, want a and b (not c)", h.GetSampleCount())
	}
	if sum := h.GetSampleSum(); sum < 19 || sum > 21 {
		t.Errorf("create → labeled sums to %.1f s, want about 2 × 10 s", sum)
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
