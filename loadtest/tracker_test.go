package loadtest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
)

// binding is a ConfigBinding as the watch shows it: at generation gen, its
// status Ready (or not, with reason) at observed.
func binding(gen, observed int64, ready bool, reason string) *configv1alpha1.ConfigBinding {
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	cb := &configv1alpha1.ConfigBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x", Generation: gen,
		Labels: map[string]string{"kshard.dev/shard": "7"}}}
	cb.Status.ObservedGeneration = observed
	cb.Status.Conditions = []metav1.Condition{{Type: configbinding.ConditionReady, Status: status, Reason: reason, ObservedGeneration: observed}}
	return cb
}

// testObservations are observations of a fleet "fleet-1" started now.
func testObservations(t *testing.T) *observations {
	t.Helper()
	var writes, syncs atomic.Int64
	o, err := newObservations(&writes, &syncs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.close)
	o.setFleet("fleet-1", time.Now())
	return o
}

// observed is what one series of the observations holds: a histogram's
// count, or a counter's value.
func observed(t *testing.T, c any) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h != nil {
		return float64(h.GetSampleCount())
	}
	return m.GetCounter().GetValue()
}

func TestTrackerLatency(t *testing.T) {
	o := testObservations(t)
	tr := &tracker{shards: sharding.DefaultShards, objects: map[string]*objectState{}, obs: o}
	t0 := time.Now()
	// Created at generation 1, seen Ready at 1.
	tr.wrote("ns/x", 1, t0, writeCreate)
	tr.observe(binding(1, 1, true, configbinding.ReasonSynced))
	// Two updates; the status skips generation 2 and shows 3 Ready: both
	// complete then.
	tr.wrote("ns/x", 2, t0, writeUpdate)
	tr.observe(binding(2, 1, true, configbinding.ReasonSynced)) // stale status: not Ready for 2
	tr.wrote("ns/x", 3, t0, writeUpdate)
	if n := tr.pendingCount(); n != 2 {
		t.Fatalf("%d pending, want generations 2 and 3", n)
	}
	tr.observe(binding(3, 3, true, configbinding.ReasonSynced))
	if n := tr.pendingCount(); n != 0 {
		t.Fatalf("%d pending after generation 3 was Ready", n)
	}
	if n := observed(t, o.ready.WithLabelValues("fleet-1", "update")); n != 2 {
		t.Errorf("%v updates Ready, want 2", n)
	}
	if n := observed(t, o.ready.WithLabelValues("fleet-1", "create")); n != 1 {
		t.Errorf("%v creates Ready, want 1", n)
	}
	if n := observed(t, o.sent.WithLabelValues("fleet-1", "update")); n != 2 {
		t.Errorf("%v updates sent, want 2", n)
	}
	// The watch can show a generation Ready before the write's response
	// arrives: the write completes at once.
	tr.observe(binding(4, 4, true, configbinding.ReasonSynced))
	tr.wrote("ns/x", 4, time.Now(), writeUpdate)
	if n := tr.pendingCount(); n != 0 {
		t.Errorf("%d pending: a write already seen Ready must complete when recorded", n)
	}
	if n, total, _ := tr.notReady(); n != 0 || total != 1 {
		t.Errorf("notReady = %d of %d, want 0 of 1", n, total)
	}
	// A later generation not Ready is reported.
	tr.wrote("ns/x", 5, time.Now(), writeUpdate)
	if n, _, ex := tr.notReady(); n != 1 || len(ex) != 1 {
		t.Errorf("notReady = %d %v, want the object at generation 5", n, ex)
	}
	if got := tr.byShard()[7]; len(got) != 1 || got[0] != "ns/x" {
		t.Errorf("byShard()[7] = %v", got)
	}
}

// reasonNotReady is the reason of a not-Ready condition in the flap test.
// The tracker counts reasons without interpreting them, so the test does not
// depend on which reasons the controller has.
const reasonNotReady = "Fetching"

func TestTrackerFlaps(t *testing.T) {
	o := testObservations(t)
	tr := &tracker{shards: sharding.DefaultShards, objects: map[string]*objectState{}, obs: o}
	tr.observe(binding(1, 1, true, configbinding.ReasonSynced))
	// A spec change: the stale True for generation 1, then Fetching for 2,
	// then Synced. Not a flap: the generation changed.
	tr.observe(binding(2, 1, true, configbinding.ReasonSynced))
	tr.observe(binding(2, 2, false, reasonNotReady))
	tr.observe(binding(2, 2, true, configbinding.ReasonSynced))
	if n := observed(t, o.flaps.WithLabelValues("fleet-1")); n != 0 {
		t.Fatalf("%v flaps for a spec change", n)
	}
	// Ready goes False at the same generation (a new holder's empty cache):
	// a flap.
	tr.observe(binding(2, 2, false, reasonNotReady))
	if n := observed(t, o.flaps.WithLabelValues("fleet-1")); n != 1 {
		t.Errorf("%v flaps, want 1", n)
	}
	if r := tr.reasons(); r[reasonNotReady] != 1 {
		t.Errorf("reasons %v", r)
	}
}
