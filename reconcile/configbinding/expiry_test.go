package configbinding_test

import (
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// shortTTLs expire cached values and not-found answers within seconds, as
// an hour (the default) does in production: tests with long TTLs never see
// what happens to a key nobody read for a while.
var shortTTLs = externalcache.Options{HardTTL: 2 * time.Second, SoftTTL: time.Second, NegativeTTL: time.Second, CleanWindow: time.Second}

// TestChangeOfExpiredKeyPropagates: a key changes in the config center after
// its cached value expired; the change still reaches the ConfigMap (the feed
// requeues the key's bindings whatever the cache holds), instead of waiting
// for the informers' resync (10 h).
func TestChangeOfExpiredKeyPropagates(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnv(t, "expired", shortTTLs)
	if _, err := e.cc.Put("domain-1", "key-0", "before"); err != nil {
		t.Fatal(err)
	}
	e.create(t, "app", "domain-1", "key-0")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	e.waitData(t, "app-config", map[string]string{"key-0": "before"})
	// Past the hard TTL: nothing servable is cached any more. Waiting
	// longer only makes the case clearer.
	time.Sleep(2 * shortTTLs.HardTTL)
	if _, err := e.cc.Put("domain-1", "key-0", "after"); err != nil {
		t.Fatal(err)
	}
	e.waitData(t, "app-config", map[string]string{"key-0": "after"})
}

// TestKeyCreatedAfterNegativeTTLHeals: a binding names a key that does not
// exist (KeyNotFound); the key is created after the cached not-found answer
// expired; the binding heals through the change feed.
func TestKeyCreatedAfterNegativeTTLHeals(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnv(t, "negative", shortTTLs)
	e.create(t, "app", "domain-1", "key-0", "late-key")
	e.waitReason(t, "app", configbinding.ReasonKeyNotFound)
	time.Sleep(2 * shortTTLs.NegativeTTL)
	if _, err := e.cc.Put("domain-1", "late-key", "here"); err != nil {
		t.Fatal(err)
	}
	e.waitReason(t, "app", configbinding.ReasonSynced)
	e.waitData(t, "app-config", map[string]string{"late-key": "here"})
}
