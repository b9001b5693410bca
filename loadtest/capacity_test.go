package loadtest

import (
	"math"
	"strings"
	"testing"
)

// TestCapacitySearchRepeatsBeforeBelieving: a fleet that holds every rate
// up to 40 updates/s, but whose first window at each rate says the
// opposite (a slow or a lucky window on a shared machine), is found within
// the bracket's precision below 40, as a fleet with no noisy window is.
// Believing one window per rate would put it at 0 (the first window at 10
// misses, and every lower one too). A rate whose two windows agree is not
// tried a third time.
func TestCapacitySearchRepeatsBeforeBelieving(t *testing.T) {
	const truth = 40.0
	precision := math.Pow(capacityStep, 1/math.Pow(2, capacityBisections))
	for _, firstWrong := range []bool{false, true} {
		windows := map[float64]int{}
		window := func(rate float64) (bool, error) {
			windows[rate]++
			held := rate <= truth
			if firstWrong && windows[rate] == 1 {
				held = !held
			}
			return held, nil
		}
		capacity, missed, err := capacitySearch(10, window)
		if err != nil {
			t.Fatal(err)
		}
		if capacity > truth || capacity*precision*1.001 < truth || missed <= truth {
			t.Errorf("first window wrong %v: capacity %.2f, missed %.2f; want the capacity within ×%.3f below %.0f and the miss above it",
				firstWrong, capacity, missed, precision, truth)
		}
		want := 2
		if firstWrong {
			want = 3
		}
		for rate, n := range windows {
			if n != want {
				t.Errorf("first window wrong %v: %d windows at %.2f updates/s, want %d", firstWrong, n, rate, want)
			}
		}
	}
}

// TestSuperlinearCapacityFailsItsRow: the committed 50m report's fleets
// (×4 at 3.72 of linear) fail the scale-out check and are marked in the
// table as a wrong baseline; fleets within linear whose largest reaches
// the goal pass it, and a largest below the goal fails it.
func TestSuperlinearCapacityFailsItsRow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		caps   []CapacityResult
		passed bool
		detail string
	}{
		{"the 50m report", []CapacityResult{
			{Fleet: "sharded ×1", Replicas: 1, Capacity: 4.8, Missed: 4.9},
			{Fleet: "sharded ×2", Replicas: 2, Capacity: 8.4, Missed: 8.6},
			{Fleet: "sharded ×4", Replicas: 4, Capacity: 71.4, Missed: 73.2},
			{Fleet: "sharded ×5", Replicas: 5, Capacity: 74.7, Missed: 76.6},
		}, false, "sharded ×4 at 3.72 of linear; sharded ×5 at 3.11 of linear"},
		{"linear", []CapacityResult{
			{Fleet: "sharded ×1", Replicas: 1, Capacity: 20, Missed: 21},
			{Fleet: "sharded ×2", Replicas: 2, Capacity: 39, Missed: 41},
			{Fleet: "sharded ×5", Replicas: 5, Capacity: 92, Missed: 95},
		}, true, "every fleet within"},
		{"below the goal", []CapacityResult{
			{Fleet: "sharded ×1", Replicas: 1, Capacity: 20, Missed: 21},
			{Fleet: "sharded ×5", Replicas: 5, Capacity: 80, Missed: 84},
		}, false, "sharded ×5 at 0.80 of linear, below 0.90"},
	} {
		r := &run{report: &Report{Capacity: tc.caps}}
		capacityFindings(r)
		if n := len(r.report.Checks); n != 1 {
			t.Fatalf("%s: %d checks, want 1", tc.name, n)
		}
		c := r.report.Checks[0]
		if c.Passed != tc.passed || !strings.Contains(c.Detail, tc.detail) {
			t.Errorf("%s: check passed %v (%s), want %v with %q", tc.name, c.Passed, c.Detail, tc.passed, tc.detail)
		}
		var b strings.Builder
		renderCapacity(&b, tc.caps)
		if marked, superlinear := strings.Contains(b.String(), "superlinear"), tc.name == "the 50m report"; marked != superlinear {
			t.Errorf("%s: the table marks a superlinear row: %v, want %v\n%s", tc.name, marked, superlinear, b.String())
		}
	}
}
