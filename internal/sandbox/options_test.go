package sandbox

import (
	"strings"
	"testing"
)

// A negative shard count is refused with the field named, not passed over
// as "the controller's default".
func TestOptionsRefuseNegativeShards(t *testing.T) {
	opts := Options{Executable: "kshard", Dir: t.TempDir(), Shards: -1}
	err := opts.setDefaults()
	if err == nil || !strings.Contains(err.Error(), "shards must not be negative") {
		t.Fatalf("setDefaults with Shards -1: %v", err)
	}
	opts = Options{Executable: "kshard", Dir: t.TempDir(), Shards: 16}
	if err := opts.setDefaults(); err != nil {
		t.Fatalf("setDefaults with Shards 16: %v", err)
	}
}
