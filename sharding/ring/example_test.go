package ring_test

import (
	"fmt"

	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/ring"
)

// A domain's shard never changes; which replica runs it depends on the live
// members. Adding a member moves whole shards, never objects.
func ExampleNew() {
	shard := sharding.ShardOf("payments", 64)
	fmt.Println("payments is in shard", shard)

	three := ring.New(64, []string{"kshard-0", "kshard-1", "kshard-2"})
	four := ring.New(64, []string{"kshard-0", "kshard-1", "kshard-2", "kshard-3"})
	moved := 0
	for s := range int32(64) {
		if three.Owner(s) != four.Owner(s) {
			moved++
		}
	}
	fmt.Println("shard of payments after scaling:", sharding.ShardOf("payments", 64))
	fmt.Println("shards that moved from 3 to 4 members:", moved)
	// Output:
	// payments is in shard 56
	// shard of payments after scaling: 56
	// shards that moved from 3 to 4 members: 15
}
