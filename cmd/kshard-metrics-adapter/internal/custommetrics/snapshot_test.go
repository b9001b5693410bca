package custommetrics

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/kshard/kshard/internal/promtext"
)

// scrape is a replica's /metrics holding two shards of ring kshard and one
// of ring other, with the families around it that the sum must not read.
const scrape = `# HELP kshard_shard_objects Primary objects in the informer cache of each shard this replica holds.
# TYPE kshard_shard_objects gauge
kshard_shard_objects{ring="kshard",shard="3"} 1200
kshard_shard_objects{ring="kshard",shard="17"} 3800
kshard_shard_objects{ring="other",shard="3"} 7
# HELP kshard_shards_owned Shards this replica holds the Lease of and runs.
# TYPE kshard_shards_owned gauge
kshard_shards_owned{ring="kshard"} 2
# TYPE kshard_shard_objects_bogus gauge
kshard_shard_objects_bogus 99
`

func sampleOf(t *testing.T, text string, podLabels labels.Set) podSample {
	t.Helper()
	fams, err := promtext.Parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return podSample{labels: podLabels, series: seriesOf(fams[DefaultSourceMetric]), at: time.Unix(1700000000, 0)}
}

func mustSelector(t *testing.T, s string) labels.Selector {
	t.Helper()
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// TestSumPerPod: a pod's value is the sum of the source family's series,
// all of them or those the metric selector matches; other families, and a
// NaN gauge, add nothing; a replica without the family holds zero objects.
func TestSumPerPod(t *testing.T) {
	s := sampleOf(t, scrape, nil)
	for sel, want := range map[string]float64{
		"":             5007,
		"ring=kshard":  5000,
		"ring=other":   7,
		"shard=3":      1207,
		"ring=missing": 0,
	} {
		if got := s.sum(mustSelector(t, sel)); got != want {
			t.Errorf("sum with metric selector %q = %v, want %v", sel, got, want)
		}
	}
	empty := sampleOf(t, "# TYPE kshard_shards_owned gauge\nkshard_shards_owned{ring=\"kshard\"} 0\n", nil)
	if got := empty.sum(labels.Everything()); got != 0 || empty.series == nil {
		t.Errorf("a replica holding no shard sums to %v (series %v), want 0", got, empty.series)
	}
	withNaN := podSample{series: []series{{value: 4}, {value: math.NaN()}, {value: math.Inf(1)}}}
	if got := withNaN.sum(labels.Everything()); got != 4 {
		t.Errorf("NaN and infinite series summed to %v, want them skipped (4)", got)
	}
}

// TestSnapshotMatching: a query sees the pods of its namespace that its
// selector matches, by name.
func TestSnapshotMatching(t *testing.T) {
	app := labels.Set{"app.kubernetes.io/name": "kshard"}
	snap := &snapshot{pods: map[types.NamespacedName]podSample{
		{Namespace: "a", Name: "kshard-1"}: {labels: app},
		{Namespace: "a", Name: "kshard-0"}: {labels: app},
		{Namespace: "a", Name: "other"}:    {labels: labels.Set{"app.kubernetes.io/name": "other"}},
		{Namespace: "b", Name: "kshard-0"}: {labels: app},
	}}
	got := snap.matching("a", mustSelector(t, "app.kubernetes.io/name=kshard"))
	want := []types.NamespacedName{{Namespace: "a", Name: "kshard-0"}, {Namespace: "a", Name: "kshard-1"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("matching = %v, want %v", got, want)
	}
	if got := snap.matching("c", labels.Everything()); len(got) != 0 {
		t.Errorf("another namespace matched %v", got)
	}
}

func TestQuantity(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 5000: "5k", 4321: "4321", 2.5: "2500m"} {
		q := quantity(v)
		if got := q.String(); got != want {
			t.Errorf("quantity(%v) = %s, want %s", v, got, want)
		}
	}
}

// testProvider is a Provider with defaults and no informer: the answers
// from a snapshot, without scraping.
func testProvider(t *testing.T) *Provider {
	t.Helper()
	p := &Provider{}
	if err := p.opts.setDefaults(); err != nil {
		t.Fatal(err)
	}
	return p
}

var objectsHeld = provider.CustomMetricInfo{GroupResource: schema.GroupResource{Resource: "pods"}, Namespaced: true, Metric: DefaultMetric}

// TestProviderAnswers: the answers to the HPA's queries come from the
// published snapshot; none is published before the first round; other
// metrics and resources are not found.
func TestProviderAnswers(t *testing.T) {
	ctx := context.Background()
	p := testProvider(t)
	if _, err := p.GetMetricBySelector(ctx, "ns", labels.Everything(), objectsHeld, labels.Everything()); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("before the first round: got %v, want ServiceUnavailable", err)
	}
	if p.HasSynced() {
		t.Error("synced before the first round")
	}
	app := labels.Set{"app.kubernetes.io/name": "kshard"}
	p.snap.Store(&snapshot{pods: map[types.NamespacedName]podSample{
		{Namespace: "ns", Name: "kshard-0"}: sampleOf(t, scrape, app),
		{Namespace: "ns", Name: "kshard-1"}: sampleOf(t, "", app),
	}})
	if !p.HasSynced() {
		t.Error("not synced after a round")
	}

	list, err := p.GetMetricBySelector(ctx, "ns", mustSelector(t, "app.kubernetes.io/name=kshard"), objectsHeld, labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, v := range list.Items {
		got[v.DescribedObject.Name] = v.Value.String()
		if v.DescribedObject.Kind != "Pod" || v.DescribedObject.Namespace != "ns" || v.Metric.Name != DefaultMetric || v.Timestamp.IsZero() {
			t.Errorf("value %+v", v)
		}
	}
	if len(got) != 2 || got["kshard-0"] != "5007" || got["kshard-1"] != "0" {
		t.Errorf("values by pod %v, want kshard-0 5007 and kshard-1 0", got)
	}

	v, err := p.GetMetricByName(ctx, types.NamespacedName{Namespace: "ns", Name: "kshard-0"}, objectsHeld, mustSelector(t, "ring=kshard"))
	if err != nil {
		t.Fatal(err)
	}
	if v.Value.String() != "5k" || v.Metric.Selector == nil || v.Metric.Selector.MatchLabels["ring"] != "kshard" {
		t.Errorf("kshard-0 of ring kshard: %s, selector %v; want 5k and the metric selector", v.Value.String(), v.Metric.Selector)
	}
	if _, err := p.GetMetricByName(ctx, types.NamespacedName{Namespace: "ns", Name: "kshard-9"}, objectsHeld, labels.Everything()); !apierrors.IsNotFound(err) {
		t.Errorf("a pod not scraped: got %v, want NotFound", err)
	}
	for _, info := range []provider.CustomMetricInfo{
		{GroupResource: schema.GroupResource{Resource: "pods"}, Namespaced: true, Metric: "something_else"},
		{GroupResource: schema.GroupResource{Group: "apps", Resource: "statefulsets"}, Namespaced: true, Metric: DefaultMetric},
	} {
		if _, err := p.GetMetricBySelector(ctx, "ns", labels.Everything(), info, labels.Everything()); !apierrors.IsNotFound(err) {
			t.Errorf("%s: got %v, want NotFound", info, err)
		}
	}
	if all := p.ListAllMetrics(); len(all) != 1 || all[0] != objectsHeld {
		t.Errorf("ListAllMetrics = %v, want only %v", all, objectsHeld)
	}
}

func TestOptions(t *testing.T) {
	var o Options
	if err := o.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if o.Namespace != "kshard-system" || o.Selector.String() != "app.kubernetes.io/name=kshard" || o.Period != 15*time.Second ||
		o.Timeout != 5*time.Second || o.TLSVerify != TLSVerifyAuto || o.TokenFile != DefaultTokenFile {
		t.Errorf("defaults %+v", o)
	}
	for ip, want := range map[string]string{"10.1.2.3": "https://10.1.2.3:8443/metrics", "fd00::7": "https://[fd00::7]:8443/metrics"} {
		got, err := o.URL(&corev1.Pod{Status: corev1.PodStatus{PodIP: ip}})
		if err != nil || got != want {
			t.Errorf("URL of a pod at %s = %q, %v; want %q", ip, got, err, want)
		}
	}
	if _, err := o.URL(&corev1.Pod{}); err == nil {
		t.Error("a pod without an IP has a URL")
	}
	short := Options{Period: time.Second}
	if err := short.setDefaults(); err != nil || short.Timeout != time.Second {
		t.Errorf("a 1 s period: timeout %s, %v; want the period", short.Timeout, err)
	}
	for name, bad := range map[string]Options{
		"timeout above period": {Period: time.Second, Timeout: 2 * time.Second},
		"negative period":      {Period: -time.Second},
		"unknown verification": {TLSVerify: "maybe"},
		"port":                 {Port: 70000},
	} {
		if err := bad.setDefaults(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestTLSVerificationChoice: auto verifies exactly when a CA is given.
func TestTLSVerificationChoice(t *testing.T) {
	for _, tc := range []struct {
		verify TLSVerification
		ca     string
		skip   bool
	}{
		{TLSVerifyAuto, "", true},
		{TLSVerifyAuto, "/ca.crt", false},
		{TLSVerify, "", false},
		{TLSVerify, "/ca.crt", false},
		{TLSSkipVerify, "", true},
		{TLSSkipVerify, "/ca.crt", true},
	} {
		o := Options{TLSVerify: tc.verify, CAFile: tc.ca}
		if got := o.insecure(logr.Discard()); got != tc.skip {
			t.Errorf("%s with CA %q: skip verification %v, want %v", tc.verify, tc.ca, got, tc.skip)
		}
	}
}
