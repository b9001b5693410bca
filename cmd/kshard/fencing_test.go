package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
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
	if err := writeFence(&want, "kshard", "kshard-system", replica.DefaultShardTable, sharding.DefaultLabelPrefix, sharding.DefaultShards); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, want.Bytes()) {
		t.Error("deploy/base/shard-fence.yaml is not what `kshard fencing` writes: run `go run ./cmd/kshard fencing > deploy/base/shard-fence.yaml`")
	}
}

// TestFencingFollowsTheLabelPrefix: a ring under another label prefix gets
// its fence on its own shard label, and none of kshard's.
func TestFencingFollowsTheLabelPrefix(t *testing.T) {
	var out bytes.Buffer
	if err := writeFence(&out, "pricing", "pricing-system", "pricing-table", "pricing.example.dev", 4); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if n := strings.Count(got, "pricing.example.dev/shard: \"3\""); n != 1 {
		t.Errorf("%d bindings select pricing.example.dev/shard=3, want 1:\n%s", n, got)
	}
	if strings.Contains(got, sharding.LabelShard) {
		t.Errorf("the fence of another prefix names %s:\n%s", sharding.LabelShard, got)
	}
	if !strings.Contains(got, "--label-prefix pricing.example.dev") {
		t.Error("the header does not say how to regenerate it")
	}
}
