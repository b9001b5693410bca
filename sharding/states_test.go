package sharding

import (
	"testing"
)

// TestShardLifecycleEndsInStopped: from every state of shardLifecycle,
// Stop leads to Stopped, no event leads back to an earlier state, and
// Stopped is left by none.
func TestShardLifecycleEndsInStopped(t *testing.T) {
	for from := stateAcquiring; from <= stateStopped; from++ {
		next := shardLifecycle[from]
		if from == stateStopped {
			if len(next) > 0 {
				t.Errorf("Stopped is left by %v", next)
			}
			continue
		}
		if next[eventStop] != stateStopped {
			t.Errorf("%s: Stop leads to %s, want Stopped", from, next[eventStop])
		}
		for ev, to := range next {
			if to <= from {
				t.Errorf("%s: %s leads back to %s", from, ev, to)
			}
		}
	}
}
