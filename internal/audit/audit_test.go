package audit

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding"
)

func TestFindOverlapsSameReplicaIsNotAnOverlap(t *testing.T) {
	t0 := time.Now()
	byObject := map[string][]Interval{"ns/x": {
		{Replica: "a", Start: t0, End: t0.Add(time.Second)},
		{Replica: "a", Start: t0.Add(time.Millisecond), End: t0.Add(2 * time.Second)},
	}}
	if o := Overlaps(byObject); len(o) != 0 {
		t.Errorf("overlaps %v: intervals of one replica are not a violation", o)
	}
}

func TestTenuresOf(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	got := Tenures([]LeaseVersion{
		{"a_1", sec(0)},
		{"a_1", sec(5)}, // acquired again by its holder: one tenure
		{"", sec(10)},   // released
		{"b_1", sec(12)},
		{"c_1", sec(40)}, // taken over after expiry
		{"a_2", sec(50)},
	})
	want := []Tenure{{"a_1", sec(0), sec(10)}, {"b_1", sec(12), sec(40)}, {"c_1", sec(40), sec(50)}, {"a_2", sec(50), time.Time{}}}
	if !slices.Equal(got, want) {
		t.Errorf("tenures %v\nwant    %v", got, want)
	}
	if got := Tenures([]LeaseVersion{{"", sec(0)}}); len(got) != 0 {
		t.Errorf("a Lease never held: tenures %v", got)
	}
}

func TestStrayWrites(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	tenures := map[int32][]Tenure{0: {{"a_1", sec(0), sec(10)}, {"b_1", sec(12), sec(40)}, {"a_2", sec(40), time.Time{}}}}
	write := func(replica string, shard int32, name string, at time.Time, until *time.Time) sharding.AuditRecord {
		return sharding.AuditRecord{Time: at, Event: "write", Replica: replica, Shard: shard, Namespace: "ns", Name: name, Until: until}
	}
	stray := StrayWrites([]sharding.AuditRecord{
		write("a", 0, "in-first-tenure", sec(1), ptr.To(sec(9))),
		write("a", 0, "after-release", sec(11), nil),
		// b was paused: its write returned at 45s, after a's successor took
		// the shard at 40s, but its hold ended at 38s: sent by then.
		write("b", 0, "late-but-held", sec(45), ptr.To(sec(38))),
		write("b", 0, "beyond-its-hold", sec(41), ptr.To(sec(42))),
		write("b", 0, "at-takeover", sec(40), nil), // a tenure ends before its successor's
		write("a", 0, "from-acquire", sec(40), nil),
		write("a", 0, "restarted", sec(100), nil),
		write("a", 1, "shard-never-held", sec(1), nil),
	}, tenures)
	var names []string
	for _, s := range stray {
		names = append(names, s.Write.Name)
	}
	want := []string{"shard-never-held", "after-release", "at-takeover", "beyond-its-hold"}
	if !slices.Equal(names, want) {
		t.Fatalf("stray writes %v, want %v", names, want)
	}
	if s := stray[3]; s.Holder != "a_2" || !s.At.Equal(sec(41)) {
		t.Errorf("%v: want it at 41s, in a_2's tenure", s)
	}
	if s := stray[1]; s.Holder != "" || !strings.Contains(s.String(), "held by nobody") {
		t.Errorf("%v: want it in no tenure", s)
	}
	if n := LateWrites([]sharding.AuditRecord{write("b", 0, "x", sec(45), ptr.To(sec(38))), write("a", 0, "y", sec(1), ptr.To(sec(9)))}); n != 1 {
		t.Errorf("%d late writes, want 1", n)
	}
}
