package configbinding_test

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// TestValuesThatDoNotFitAreNamed: a binding whose values the replica's external cache cannot
// hold together says so (ValuesDoNotFit, naming the cache's size) instead of waiting silently
// while its values evict each other.
func TestValuesThatDoNotFitAreNamed(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	// 17 values of 60 KiB (a ConfigMap's worth: 1,020 KiB) in a 1 MiB cache of eight 128 KiB
	// internal shards, each of which holds two: by pigeonhole at least three land in one,
	// wherever the hash puts them. (With 16, an even spread fits all, and the keys, which
	// carry the shard's tenure, spread differently from run to run.)
	e := startEnv(t, "fit", externalcache.Options{MaxBytes: 1 << 20, InternalShards: 8, MaxEntryBytes: 62 << 10})
	var keys []string
	for i := range 17 {
		k := fmt.Sprintf("big-%02d", i)
		if _, err := e.cc.Put("fit", k, strings.Repeat("v", 60<<10)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	e.create(t, "big", "fit", keys...)
	cb := e.waitReason(t, "big", configbinding.ReasonValuesDoNotFit)
	c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
	if !strings.Contains(c.Message, "MaxBytes 1048576") || !strings.Contains(c.Message, "fit/big-") {
		t.Errorf("message does not name the value and the cache's size: %q", c.Message)
	}
}

// TestValueTooLargeIsNamed: a value in etcd larger than the replica's
// cache holds makes its binding say ValueTooLarge, naming the key and the
// limit, not that the config center is unavailable; the ConfigMap keeps
// its last values, and a smaller value heals it.
func TestValueTooLargeIsNamed(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center prefix
	e := startEnv(t, "toolarge", externalcache.Options{MaxEntryBytes: 16 << 10})
	if _, err := e.cc.Put("toolarge", "k", "small"); err != nil {
		t.Fatal(err)
	}
	e.create(t, "app", "toolarge", "k")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	if _, err := e.cc.Put("toolarge", "k", strings.Repeat("v", 100<<10)); err != nil {
		t.Fatal(err)
	}
	cb := e.waitReason(t, "app", configbinding.ReasonValueTooLarge)
	c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
	if !strings.Contains(c.Message, "toolarge/k") || !strings.Contains(c.Message, "16384") {
		t.Errorf("message does not name the key and the limit: %q", c.Message)
	}
	if got := e.configMap(t, "app-config").Data["k"]; got != "small" {
		t.Errorf("the ConfigMap holds %.20q, want its last value", got)
	}
	if _, err := e.cc.Put("toolarge", "k", "fits again"); err != nil {
		t.Fatal(err)
	}
	e.waitReason(t, "app", configbinding.ReasonSynced)
}
