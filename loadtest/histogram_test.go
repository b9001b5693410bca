package loadtest

import (
	"math"
	"testing"
	"time"
)

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	if h.Quantile(0.99) != 0 || h.Within(time.Second) != 1 {
		t.Fatal("an empty histogram must report 0 and nothing missed")
	}
	// 1..100 ms in shuffled order.
	for i := range 100 {
		h.Observe(time.Duration((i*37)%100+1) * time.Millisecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 50 * time.Millisecond, 0.9: 90 * time.Millisecond, 0.99: 99 * time.Millisecond, 1: 100 * time.Millisecond, 0.001: time.Millisecond} {
		if got := h.Quantile(q); got != want {
			t.Errorf("Quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if got := h.Within(25 * time.Millisecond); got != 0.25 {
		t.Errorf("Within(25ms) = %v, want 0.25", got)
	}
	h.Observe(-time.Second)
	if h.Quantile(0.001) != 0 {
		t.Error("a negative latency must count as zero")
	}
}

func TestHistogramBucketsIncludeSLOs(t *testing.T) {
	var sawFast, sawSLO bool
	for i, b := range LatencyBuckets {
		sawFast = sawFast || b == SLOFast
		sawSLO = sawSLO || b == SLO
		if i > 0 && b <= LatencyBuckets[i-1] {
			t.Fatalf("buckets not ascending at %v", b)
		}
	}
	if !sawFast || !sawSLO {
		t.Fatal("the buckets must include the 1 s and 5 s SLOs as bounds")
	}
	var h histogram
	for _, d := range []time.Duration{SLOFast, SLOFast + 1, SLO, 2 * time.Hour} {
		h.Observe(d)
	}
	b := h.Buckets()
	at := func(d time.Duration) int {
		for i, x := range LatencyBuckets {
			if x == d {
				return b[i]
			}
		}
		return -1
	}
	if at(SLOFast) != 1 || at(2*time.Second) != 1 || at(SLO) != 1 || b[len(b)-1] != 1 {
		t.Errorf("buckets %v: a sample equal to a bound belongs to it, one above goes to the next", b)
	}
}

func TestBucketQuantile(t *testing.T) {
	inf := math.Inf(1)
	bounds := []float64{0.1, 0.5, 1, inf}
	// 50 at ≤0.1, 40 more at ≤0.5, 10 more at ≤1.
	counts := []float64{50, 90, 100, 100}
	for q, want := range map[float64]float64{0.5: 0.1, 0.7: 0.3, 0.99: 0.95, 0.25: 0.05} {
		got, ok := bucketQuantile(q, bounds, counts)
		if !ok || math.Abs(got-want) > 1e-9 {
			t.Errorf("bucketQuantile(%v) = %v, %v; want %v", q, got, ok, want)
		}
	}
	if got, ok := bucketQuantile(0.99, bounds, []float64{0, 0, 10, 20}); !ok || got != 1 {
		t.Errorf("a quantile in the +Inf bucket = %v, %v; want the highest finite bound 1", got, ok)
	}
	if _, ok := bucketQuantile(0.5, bounds, []float64{0, 0, 0, 0}); ok {
		t.Error("no observations must report !ok")
	}
}
