package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
)

// TestShippedFencingBindingsAreGenerated: deploy/base's fence is what
// `kshard fencing` writes for the default ring, so every shard of it is
// fenced (a shard without a binding would be checked by nothing) and the
// label policy allows exactly its shards.
func TestShippedFencingBindingsAreGenerated(t *testing.T) {
	shipped, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "shard-fence.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := writeFence(&want, "kshard", "kshard-system", replica.DefaultShardTable, sharding.DefaultShards); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, want.Bytes()) {
		t.Error("deploy/base/shard-fence.yaml is not what `kshard fencing` writes: run `go run ./cmd/kshard fencing > deploy/base/shard-fence.yaml`")
	}
}
