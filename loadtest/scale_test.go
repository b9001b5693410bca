package loadtest

import (
	"strings"
	"testing"
)

// TestHeapGoalsJudgeTheLiveHeap: the scale scenario's heap goals are judged
// on the live heap where both fleets have it (the heap in use, which adds
// uncollected garbage, given beside it), and on the heap in use where a
// fleet has no live heap.
func TestHeapGoalsJudgeTheLiveHeap(t *testing.T) {
	const mib = 1 << 20
	figures := func(v ...float64) []Figure {
		names := []string{figHeapPeak, figHeapEnd, figHeapEndSum, figLiveHeapPeak, figLiveHeapEnd, figLiveHeapEndSum}
		var out []Figure
		for i, x := range v {
			out = append(out, Figure{Name: names[i], Unit: "bytes", Value: x * mib})
		}
		return out
	}
	single := &FleetResult{Fleet: "sharding off ×1", Replicas: 1, Figures: figures(800, 500, 500, 600, 400, 400)}
	// In use, the ×4's end reads 0.36× (not met); live, 0.25× (met).
	sharded := &FleetResult{Fleet: "sharded ×4", Replicas: 4, Figures: figures(300, 180, 600, 170, 100, 440)}
	got := heapGoals(sharded, single)
	want := []string{
		"sharded ×4: largest replica's peak live heap = 0.28× (170.0 MiB against 600.0 MiB) sharding off ×1's: goal ≤ 0.30×, met; heap in use 0.38× (300.0 MiB against 800.0 MiB)",
		"sharded ×4: largest replica's live heap at the end of the load = 0.25× (100.0 MiB against 400.0 MiB) sharding off ×1's: goal ≤ 0.30×, met; heap in use 0.36× (180.0 MiB against 500.0 MiB)",
		"sharded ×4: whole fleet's live heap at the end of the load = 1.10× (440.0 MiB against 400.0 MiB) sharding off ×1's: goal ≤ 1.15×, met; heap in use 1.20× (600.0 MiB against 500.0 MiB)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("heap goals:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Without the live heap (a query that found no data).
	old := *sharded
	old.Figures = figures(300, 180, 600)
	got = heapGoals(&old, single)
	if !strings.Contains(got[1], "largest replica's heap in use at the end of the load = 0.36×") || !strings.Contains(got[1], "not met") || strings.Contains(got[1], "live") {
		t.Errorf("without the live heap, the heap in use is judged: %q", got[1])
	}
}
