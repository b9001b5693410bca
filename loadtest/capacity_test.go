package loadtest

import (
	"math"
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
