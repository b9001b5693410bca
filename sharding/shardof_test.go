package sharding

import (
	"fmt"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// xxhasher is the hasher of the ring's consistent hashing (package ring).
type xxhasher struct{}

func (xxhasher) Sum64(data []byte) uint64 { return xxhash.Sum64(data) }

func TestShardOfMatchesConsistent(t *testing.T) {
	c := consistent.New(nil, consistent.Config{PartitionCount: 64, ReplicationFactor: 1, Load: 1.1, Hasher: xxhasher{}})
	for i := range 1000 {
		d := fmt.Sprintf("domain-%d", i)
		if got, want := ShardOf(d, 64), int32(c.FindPartitionID([]byte(d))); got != want {
			t.Fatalf("ShardOf(%q) = %d, consistent says %d", d, got, want)
		}
	}
}
