package loadtest

import (
	"testing"
	"time"

	"github.com/kshard/kshard/internal/audit"
)

func TestSplitLatenciesJoinsTheReconcileThatDidTheWork(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	byObject := map[string][]audit.Interval{
		"ns/a": {
			{Start: ms(-50), End: ms(-40), Generation: 1}, // before the write
			{Start: ms(30), End: ms(45), Generation: 2},   // did the work
			{Start: ms(46), End: ms(47), Generation: 2},   // the no-op after it
			{Start: ms(10), End: ms(12), Generation: 1},   // an older generation's
		},
	}
	samples := []latencySample{
		{Key: "ns/a", Gen: 2, Done: ms(60), Latency: 60 * time.Millisecond},
		{Key: "ns/b", Gen: 1, Done: ms(60), Latency: 60 * time.Millisecond}, // never reconciled
	}
	s := splitLatencies(samples, byObject)
	if s == nil || s.Joined != 1 || s.Updates != 2 {
		t.Fatalf("split %+v, want 1 of 2 updates joined", s)
	}
	if got := s.ToReconcile.Max; got != 30*time.Millisecond {
		t.Errorf("write → reconcile start %s, want 30ms", got)
	}
	if got := s.FromReconcile.Max; got != 30*time.Millisecond {
		t.Errorf("reconcile start → Ready seen %s, want 30ms", got)
	}
	if splitLatencies(samples[1:], byObject) != nil {
		t.Error("a split with nothing joined is not nil")
	}
}
