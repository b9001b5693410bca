package sandbox

import (
	"strings"
	"testing"

	"github.com/kshard/kshard/sharding/ring"
)

func TestRanges(t *testing.T) {
	for _, tc := range []struct {
		in   []int32
		want string
	}{
		{nil, ""},
		{[]int32{5}, "5"},
		{[]int32{9, 0, 1, 2, 3, 7, 10, 11, 12}, "0-3,7,9-12"},
	} {
		if got := ranges(tc.in); got != tc.want {
			t.Errorf("ranges(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRingJudgements(t *testing.T) {
	ringName := func(holders ...string) *ring.Status {
		st := &ring.Status{ShardCount: int32(len(holders)),
			Members: []ring.MemberStatus{{Name: "a", Live: true}, {Name: "b", Live: true}}}
		for i, h := range holders {
			st.Shards = append(st.Shards, ring.ShardStatus{Shard: int32(i), Holder: h, Desired: "a", Objects: i})
			if h == "" {
				st.Unowned = append(st.Unowned, int32(i))
			}
		}
		return st
	}
	if ok, _ := balanced(ringName("a", "a")); !ok {
		t.Error("a ring held by its desired owners is not balanced")
	}
	if ok, detail := balanced(ringName("a", "")); ok || !strings.Contains(detail, "unowned") {
		t.Errorf("an unowned shard: balanced %v, %q", ok, detail)
	}
	if ok, detail := balanced(ringName("a", "b")); ok || !strings.Contains(detail, "desired") {
		t.Errorf("a shard held by the wrong member: balanced %v, %q", ok, detail)
	}
	if ok, detail := gone("b")(ringName("a", "a")); ok || !strings.Contains(detail, "live ring member") {
		t.Errorf("a live member is not gone: %v, %q", ok, detail)
	}
	if got := moves(ringName("a", "b", "b"), ringName("a", "a", "a")); !strings.Contains(got, "moved 2 shards with 3 objects (b -> a: 2)") {
		t.Errorf("moves = %q", got)
	}
	if got := relabeled(map[string]string{"x": "1"}, map[string]string{"x": "2"}); !strings.Contains(got, "WARNING") {
		t.Errorf("a relabeled object is not reported: %q", got)
	}
}
