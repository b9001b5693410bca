package loadtest

import (
	"strings"
	"testing"
	"time"
)

// TestSingletonWarmUpWaitsForFetches: a singleton's start is not over while
// its external cache still fetches keys (a Ready binding whose keys are on
// their way is reconciled only when they arrive); fetches that failed and
// wait for their next round do not hold it; a replica whose scrape lacks the
// family holds it (its warm-up cannot be seen), unless it runs with no cache.
func TestSingletonWarmUpWaitsForFetches(t *testing.T) {
	f, err := parseFamilies(strings.NewReader("# TYPE kshard_external_fetches_in_flight gauge\n" +
		"kshard_external_fetches_in_flight{state=\"queued\"} 2\n" +
		"kshard_external_fetches_in_flight{state=\"calling\"} 1\n" +
		"kshard_external_fetches_in_flight{state=\"backoff\"} 4\n" +
		"kshard_external_fetches_in_flight{state=\"failed\"} 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := replicaSampleOf(f, "").Fetching; got != 7 {
		t.Errorf("fetches under way: %v, want 7 (queued, calling, backoff; not failed)", got)
	}
	if got := replicaSampleOf(families{}, "").Fetching; got != -1 {
		t.Errorf("fetches of a scrape without the family: %v, want -1", got)
	}

	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fleetOf := func(mode Mode, fetching ...float64) *fleet {
		fl := &fleet{mode: mode, started: t0}
		for _, n := range fetching {
			fl.slots = append(fl.slots, &slot{id: "kshard-0", instances: []*instance{{proc: &container{done: make(chan struct{})},
				samples: []replicaSample{{At: t0.Add(time.Second), Fetching: n}}}}})
		}
		return fl
	}
	direct := Mode{Name: "direct off", Args: []string{"--sharding=off", "--external-mode=direct"}}
	now := t0.Add(2 * time.Second)
	for _, tc := range []struct {
		fleet *fleet
		want  float64
	}{
		{fleetOf(ModeSingleton, 0), 0},
		{fleetOf(ModeSingleton, 3, 4), 7},
		{fleetOf(ModeSingleton, 0, -1), -1},
		{fleetOf(direct, -1), 0},
		// The plain controller has no external cache: its start once
		// waited for the metric until the settle timed out.
		{fleetOf(ModePlain, -1), 0},
	} {
		if got := tc.fleet.fetching(now); got != tc.want {
			t.Errorf("%s with fetches %v: %v, want %v", tc.fleet.mode.Name, tc.fleet.slots, got, tc.want)
		}
	}
}
