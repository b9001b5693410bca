package loadtest

import (
	"math"
	"sort"
	"time"
)

// SLOs the load tester reports against, from the Kubernetes scalability SLOs
// and the anchors kshard measures itself by: p99 of a spec change to the
// status showing that generation Ready within 5 s; 1 s is the budget of one
// mutating API call and kshard's own goal.
const (
	SLOFast = time.Second
	SLO     = 5 * time.Second
)

// LatencyBuckets are the upper bounds of the latency histogram. They include
// both SLOs exactly, so "share within the SLO" is read off a bucket, not
// interpolated.
var LatencyBuckets = []time.Duration{
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, SLOFast, 2 * time.Second, SLO, 10 * time.Second, 30 * time.Second, time.Minute,
}

// histogram records latencies. It keeps every sample (a run makes at most a
// few hundred thousand) so percentiles are exact rather than interpolated
// from buckets; the buckets are for the report's distribution table.
type histogram struct {
	samples []time.Duration
	sorted  bool
}

// Observe records one latency. Negative values (clock steps) count as zero.
func (h *histogram) Observe(d time.Duration) {
	h.samples = append(h.samples, max(d, 0))
	h.sorted = false
}

// Count is the number of samples.
func (h *histogram) Count() int { return len(h.samples) }

// Quantile returns the q-quantile (0 < q ≤ 1) by the nearest-rank method:
// the smallest sample such that at least q of all samples are at or below
// it. It is 0 without samples.
func (h *histogram) Quantile(q float64) time.Duration {
	if len(h.samples) == 0 {
		return 0
	}
	h.sort()
	rank := int(math.Ceil(q*float64(len(h.samples)))) - 1
	return h.samples[min(max(rank, 0), len(h.samples)-1)]
}

// Max is the largest sample, 0 without samples.
func (h *histogram) Max() time.Duration { return h.Quantile(1) }

// Within is the share (0..1) of samples at or below d; 1 without samples,
// as no change missed it.
func (h *histogram) Within(d time.Duration) float64 {
	if len(h.samples) == 0 {
		return 1
	}
	h.sort()
	n := sort.Search(len(h.samples), func(i int) bool { return h.samples[i] > d })
	return float64(n) / float64(len(h.samples))
}

// Buckets counts the samples per bound of LatencyBuckets (each sample in
// the first bucket whose bound is at or above it); the last count is the
// samples above every bound.
func (h *histogram) Buckets() []int {
	out := make([]int, len(LatencyBuckets)+1)
	for _, s := range h.samples {
		i := sort.Search(len(LatencyBuckets), func(i int) bool { return LatencyBuckets[i] >= s })
		out[i]++
	}
	return out
}

// Merge adds another histogram's samples.
func (h *histogram) Merge(o *histogram) {
	h.samples = append(h.samples, o.samples...)
	h.sorted = false
}

func (h *histogram) sort() {
	if !h.sorted {
		sort.Slice(h.samples, func(i, j int) bool { return h.samples[i] < h.samples[j] })
		h.sorted = true
	}
}

// bucketQuantile estimates the q-quantile of a Prometheus histogram from its
// cumulative bucket counts the way PromQL's histogram_quantile does: linear
// interpolation inside the bucket that holds the rank. bounds are the upper
// bounds in ascending order, +Inf last; counts are cumulative. A quantile in
// the +Inf bucket returns the highest finite bound. ok is false without
// observations.
func bucketQuantile(q float64, bounds, counts []float64) (v float64, ok bool) {
	if len(bounds) == 0 || len(bounds) != len(counts) {
		return 0, false
	}
	total := counts[len(counts)-1]
	if total <= 0 {
		return 0, false
	}
	rank := q * total
	i := sort.Search(len(counts), func(i int) bool { return counts[i] >= rank })
	if i >= len(bounds) {
		i = len(bounds) - 1
	}
	if math.IsInf(bounds[i], 1) {
		if i == 0 {
			return 0, false
		}
		return bounds[i-1], true
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = bounds[i-1], counts[i-1]
	}
	inBucket := counts[i] - below
	if inBucket <= 0 {
		return bounds[i], true
	}
	return lower + (bounds[i]-lower)*(rank-below)/inBucket, true
}
