package lease

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
	me := Holder("r-0", "aaaa")
	live, gone := now.Add(time.Second), now.Add(-time.Second)
	for _, tc := range []struct {
		exists bool
		holder string
		expiry time.Time
		want   State
		reason string
	}{
		{false, "", time.Time{}, Absent, "created"},
		{true, "", live, Free, "released"},
		{true, "r-0", live, Free, "released"},
		{true, me, live, Ours, "reclaimed"},
		{true, me, gone, Ours, "reclaimed"},
		{true, Holder("r-0", "bbbb"), live, Held, ""},
		{true, Holder("r-1", "cccc"), live, Held, ""},
		{true, Holder("r-1", "cccc"), now, Expired, "expired"},
		{true, Holder("r-0", "bbbb"), gone, Expired, "expired"},
	} {
		got := StateOf(tc.exists, tc.holder, me, tc.expiry, now)
		reason, ok := got.Takeable()
		if got != tc.want || reason != tc.reason || ok != (tc.reason != "") {
			t.Errorf("StateOf(exists=%v, holder=%q, expiry %s) = %s (takeable %q %v), want %s (%q)",
				tc.exists, tc.holder, tc.expiry.Sub(now), got, reason, ok, tc.want, tc.reason)
		}
	}
}

// TestNamesRoundTrip: each name parses back to what made it, and only
// names of the ring's own Leases, with a shard in range, parse.
func TestNamesRoundTrip(t *testing.T) {
	if n, ok := ParseShardName("kshard", ShardName("kshard", 63), 64); !ok || n != 63 {
		t.Errorf("ParseShardName(ShardName(63)) = %d, %v", n, ok)
	}
	for _, name := range []string{"kshard-shard-64", "kshard-shard-07", "kshard-shard--1", "other-shard-3", "kshard-member-3"} {
		if n, ok := ParseShardName("kshard", name, 64); ok {
			t.Errorf("ParseShardName(%q) = %d, want no shard", name, n)
		}
	}
	if r, ok := ParseMemberName("kshard", MemberName("kshard", "kshard-2")); !ok || r != "kshard-2" {
		t.Errorf("ParseMemberName(MemberName(kshard-2)) = %q, %v", r, ok)
	}
	if _, ok := ParseMemberName("kshard", "kshard-member-"); ok {
		t.Error("a member Lease name without a replica parsed")
	}
	if got := HolderReplica(Holder("kshard-2", NewIncarnation())); got != "kshard-2" {
		t.Errorf("HolderReplica(Holder(kshard-2, …)) = %q", got)
	}
	if a, b := NewIncarnation(), NewIncarnation(); a == b || len(a) != 8 {
		t.Errorf("incarnations %q and %q: want two different 8-digit ones", a, b)
	}
}
