package sharding

import (
	"testing"
	"time"
)

// TestStateOf: the one verdict on a Lease, for each kind of holder, and
// which states may be taken. A Lease another incarnation of the same
// replica holds is another holder's (two processes run one identity); one
// kept for the replica without an incarnation is free for its next.
func TestStateOf(t *testing.T) {
	now := time.Now()
	me := HolderIdentity("r-0", "aaaa")
	live, gone := now.Add(time.Second), now.Add(-time.Second)
	for _, tc := range []struct {
		exists bool
		holder string
		expiry time.Time
		want   leaseState
		reason string
	}{
		{false, "", time.Time{}, leaseAbsent, "created"},
		{true, "", live, leaseFree, "released"},
		{true, "r-0", live, leaseFree, "released"},
		{true, me, live, leaseOurs, "reclaimed"},
		{true, me, gone, leaseOurs, "reclaimed"},
		{true, HolderIdentity("r-0", "bbbb"), live, leaseHeld, ""},
		{true, HolderIdentity("r-1", "cccc"), live, leaseHeld, ""},
		{true, HolderIdentity("r-1", "cccc"), now, leaseExpired, "expired"},
		{true, HolderIdentity("r-0", "bbbb"), gone, leaseExpired, "expired"},
	} {
		got := stateOf(tc.exists, tc.holder, me, tc.expiry, now)
		reason, ok := got.takeable()
		if got != tc.want || reason != tc.reason || ok != (tc.reason != "") {
			t.Errorf("stateOf(exists=%v, holder=%q, expiry %s) = %s (takeable %q %v), want %s (%q)",
				tc.exists, tc.holder, tc.expiry.Sub(now), got, reason, ok, tc.want, tc.reason)
		}
	}
}

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
