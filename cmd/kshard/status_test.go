package main

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

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

// TestParseKind: --kind names a core kind or a group's, and refuses a kind
// without a version rather than counting nothing.
func TestParseKind(t *testing.T) {
	for in, want := range map[string]schema.GroupVersionKind{
		"ConfigMap.v1.": {Version: "v1", Kind: "ConfigMap"},
		"ConfigBinding.v1alpha1.config.kshard.dev": {Group: "config.kshard.dev", Version: "v1alpha1", Kind: "ConfigBinding"},
	} {
		if got, err := parseKind(in); err != nil || got != want {
			t.Errorf("parseKind(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"ConfigMap", ""} {
		if _, err := parseKind(bad); err == nil {
			t.Errorf("parseKind(%q): no error", bad)
		}
	}
}
