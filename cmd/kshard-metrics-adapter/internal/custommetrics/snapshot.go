package custommetrics

import (
	"math"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kshard/kshard/internal/promtext"
)

// snapshot is one scrape round: what every replica that answered reported.
// It is never modified once published, so queries read it without locks.
type snapshot struct {
	// pods are the replicas scraped successfully in the round. A replica
	// whose scrape failed is absent, and so absent from every answer.
	pods map[types.NamespacedName]podSample
}

// podSample is what one replica reported.
type podSample struct {
	// labels are the pod's labels when the round started, which the HPA's
	// selector (the StatefulSet's) is matched against.
	labels labels.Set
	// series are the source metric's series: one per held shard.
	series []series
	// at is when the scrape completed: the metric's timestamp.
	at time.Time
}

// series is one series of the source metric.
type series struct {
	labels labels.Set
	value  float64
}

// seriesOf reads the source family's series from a scrape. A family the
// replica does not export (it holds no shard, or has sharding off) gives no
// series, which sum to zero: the replica holds no objects.
func seriesOf(f *dto.MetricFamily) []series {
	out := make([]series, 0, len(f.GetMetric()))
	for _, m := range f.GetMetric() {
		ls := make(labels.Set, len(m.GetLabel()))
		for _, l := range m.GetLabel() {
			ls[l.GetName()] = l.GetValue()
		}
		out = append(out, series{labels: ls, value: promtext.Value(m)})
	}
	return out
}

// sum adds up the pod's series that the metric selector matches (a query's
// metricSelector, e.g. ring=kshard when one process runs several rings;
// everything when empty): the objects the replica holds.
func (s podSample) sum(metricSelector labels.Selector) float64 {
	var total float64
	for _, sr := range s.series {
		// A NaN or infinite gauge is no count of objects: skipped.
		if metricSelector.Matches(sr.labels) && !math.IsNaN(sr.value) && !math.IsInf(sr.value, 0) {
			total += sr.value
		}
	}
	return total
}

// matching lists the snapshot's pods in namespace that selector matches, by
// name.
func (s *snapshot) matching(namespace string, selector labels.Selector) []types.NamespacedName {
	var out []types.NamespacedName
	for key, p := range s.pods {
		if key.Namespace == namespace && selector.Matches(p.labels) {
			out = append(out, key)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// quantity is a metric value as the custom metrics API carries it: exact
// for whole numbers (object counts), in thousandths otherwise.
func quantity(v float64) resource.Quantity {
	if v == math.Trunc(v) && math.Abs(v) < math.MaxInt64 {
		return *resource.NewQuantity(int64(v), resource.DecimalSI)
	}
	return *resource.NewMilliQuantity(int64(math.Round(v*1000)), resource.DecimalSI)
}
