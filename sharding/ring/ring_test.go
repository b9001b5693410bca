package ring

import (
	"fmt"
	"testing"
)

func replicaNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// TestRingBalance checks the documented promise: with 64 shards and 3 to 10
// members, the busiest member runs at most 1.25 times the mean.
func TestRingBalance(t *testing.T) {
	for _, prefix := range []string{"kshard-", "controller-", "replica-"} {
		for n := 3; n <= 10; n++ {
			r := New(64, replicaNames(prefix, n))
			maxLoad := 0
			total := 0
			for _, m := range r.Members() {
				l := len(r.ShardsOf(m))
				total += l
				maxLoad = max(maxLoad, l)
			}
			if total != 64 {
				t.Fatalf("%s×%d: %d shards assigned, want 64", prefix, n, total)
			}
			mean := 64.0 / float64(n)
			if ratio := float64(maxLoad) / mean; ratio > 1.25 {
				t.Errorf("%s×%d: max/mean = %d/%.2f = %.3f, want <= 1.25", prefix, n, maxLoad, mean, ratio)
			}
		}
	}
}

// TestRingMovesFewShards checks that adding a member moves shards mostly to
// the newcomer: bounded loads may shuffle a few between survivors.
func TestRingMovesFewShards(t *testing.T) {
	before := New(64, replicaNames("kshard-", 3))
	after := New(64, replicaNames("kshard-", 4))
	toNew, between := 0, 0
	for s := range int32(64) {
		if before.Owner(s) == after.Owner(s) {
			continue
		}
		if after.Owner(s) == "kshard-3" {
			toNew++
		} else {
			between++
		}
	}
	t.Logf("3→4 members: %d shards moved to the newcomer, %d between survivors", toNew, between)
	if toNew == 0 || between > toNew {
		t.Fatalf("join moved %d shards to the newcomer and %d between survivors", toNew, between)
	}
}

func TestRingDeterministicAndEmpty(t *testing.T) {
	a := New(64, []string{"b", "a", "c"})
	b := New(64, []string{"c", "b", "a"})
	for s := range int32(64) {
		if a.Owner(s) != b.Owner(s) {
			t.Fatalf("shard %d: owners differ by member order: %s vs %s", s, a.Owner(s), b.Owner(s))
		}
	}
	if got := New(8, nil).Owner(3); got != "" {
		t.Fatalf("empty ring owner = %q", got)
	}
}

func TestShardLabel(t *testing.T) {
	keys := KeysFor("kshard.dev")
	for _, tc := range []struct {
		v    string
		ok   bool
		want int32
	}{{"0", true, 0}, {"63", true, 63}, {"64", false, 0}, {"-1", false, 0}, {"07", false, 0}, {"x", false, 0}, {"", false, 0}} {
		got, ok := keys.ShardLabel(map[string]string{"kshard.dev/shard": tc.v}, 64)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%q: got %d,%v want %d,%v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
	if _, ok := keys.ShardLabel(nil, 64); ok {
		t.Error("missing label parsed")
	}
}
