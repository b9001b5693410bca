package main

import (
	"strings"
	"testing"

	"github.com/kshard/kshard/sharding/ring"
)

// TestPrintStatus: the ring's tables name every member and shard, and an
// unowned shard is called out.
func TestPrintStatus(t *testing.T) {
	st := &ring.Status{Ring: "kshard", ShardCount: 2, Unowned: []int32{1},
		Members: []ring.MemberStatus{{Name: "kshard-0", Live: true, ShardCount: 2, Held: 1, Desired: 2}},
		Shards:  []ring.ShardStatus{{Shard: 0, Holder: "kshard-0", Desired: "kshard-0", Objects: 3}, {Shard: 1, Desired: "kshard-0"}}}
	var out strings.Builder
	printStatus(&out, st)
	for _, want := range []string{"ring kshard: 2 shards, 1 unowned", "kshard-0  true", "1      <none>", "UNOWNED SHARDS (their objects are not reconciled): [1]"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}
}
