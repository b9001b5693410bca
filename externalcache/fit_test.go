package externalcache_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
)

// TestHeldShardsShareMaxBytes: the shards a replica holds share MaxBytes. One held shard of
// four may cache more than a quarter of it, without evicting any of its own values.
func TestHeldShardsShareMaxBytes(t *testing.T) {
	const (
		keys      = 48
		valueSize = 32 << 10 // 1.5 MiB in all: more than a quarter of MaxBytes
	)
	h := newHarness(t, setup{opts: func(o *externalcache.Options) {
		o.MaxBytes, o.MaxShards, o.InternalShards = 4<<20, 4, 4
	}})
	all := make([]externalcache.Key, keys)
	for i := range all {
		all[i] = externalcache.Key{Domain: "share", Name: fmt.Sprintf("k%02d", i)}
		h.put(all[i].Domain, all[i].Name, strings.Repeat("v", valueSize))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, k := range all {
		if l, err := h.cache.Wait(ctx, 0, k); err != nil || l.State != externalcache.StateFresh {
			t.Fatalf("Wait %s = %v, %v", k, l.State, err)
		}
	}
	for _, k := range all {
		if l := h.cache.Get(0, k); l.State != externalcache.StateFresh || len(l.Value) != valueSize {
			t.Errorf("%s after every value arrived = %v with %d bytes, %v; want Fresh: it was evicted", k, l.State, len(l.Value), l.Err)
		}
	}
	if got := h.calls("share", ""); got != keys {
		t.Errorf("config center answered %d reads for %d keys, want one each", got, keys)
	}
}

// TestValuesThatDoNotFitAreNamedAndDoNotLoop: one object reads more values than the cache holds.
// Refilling an evicted value evicts another; were each refill notified, the object would be
// requeued, read again, refill the next one, and loop at the rate limit. A refill notifies nobody,
// the loop ends, and a Lookup of a value evicted for room says so (ErrEvicted).
func TestValuesThatDoNotFitAreNamedAndDoNotLoop(t *testing.T) {
	const (
		keys      = 24
		valueSize = 60 << 10 // 1.4 MiB in all, in one 1 MiB internal shard
	)
	var all []externalcache.Key
	var reconciles atomic.Int64
	var reconcileMu sync.Mutex
	var h *harness
	// The object's reconcile, as the controller's: read every key it uses.
	reconcile := func() {
		reconcileMu.Lock()
		defer reconcileMu.Unlock()
		reconciles.Add(1)
		for _, k := range all {
			h.cache.Get(0, k)
		}
	}
	notified := make(chan struct{}, 1)
	h = newHarness(t, setup{opts: func(o *externalcache.Options) {
		o.MaxBytes, o.MaxShards, o.InternalShards, o.MaxEntryBytes = 1<<20, 1, 1, 64<<10
		o.OnUpdate = func(int32, externalcache.Key) {
			select {
			case notified <- struct{}{}:
			default:
			}
		}
	}})
	for i := range keys {
		all = append(all, externalcache.Key{Domain: "fit", Name: fmt.Sprintf("k%02d", i)})
		h.put("fit", all[i].Name, strings.Repeat("v", valueSize))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for {
			select {
			case <-notified:
				reconcile()
			case <-ctx.Done():
				return
			}
		}
	})
	evictionsBefore := counter(t, "kshard_externalcache_evictions_total")

	// idle: nothing queued or being fetched, and no requeue waiting or running.
	idle := func() bool {
		if s := h.cache.Stats(); s.Flights != 0 || s.QueueDepth != 0 || len(notified) != 0 || !reconcileMu.TryLock() {
			return false
		}
		reconcileMu.Unlock()
		return true
	}
	reconcile()
	eventually(t, "the object's reads settle", idle)
	settled := h.calls("fit", "")
	// Every arrival may requeue the object once, and each of those reads refills what is evicted.
	if bound := keys + keys*keys; settled > bound {
		t.Fatalf("config center answered %d reads of %d keys before the reads settled, want at most %d", settled, keys, bound)
	}
	// Another read of every key refills the evicted ones once, and requeues nothing.
	reconcile()
	eventually(t, "the object's reads settle again", idle)
	if got := h.calls("fit", ""); got > settled+keys {
		t.Errorf("one more read of %d keys cost %d reads of the config center (%d reconciles): refills requeue the object", keys, got-settled, reconciles.Load())
	}
	if got := counter(t, "kshard_externalcache_evictions_total") - evictionsBefore; got == 0 {
		t.Error("kshard_externalcache_evictions_total did not count the evictions")
	}
	named := 0
	for _, k := range all {
		l := h.cache.Get(0, k)
		if errors.Is(l.Err, externalcache.ErrEvicted) {
			named++
			if msg := l.Err.Error(); !strings.Contains(msg, k.String()) || !strings.Contains(msg, "MaxBytes 1048576") {
				t.Errorf("error %q does not name the key and the cache's size", msg)
			}
		}
	}
	if named == 0 {
		t.Errorf("no Lookup of %d values of %d bytes in a 1 MiB cache carries ErrEvicted", keys, valueSize)
	}
	t.Logf("%d reconciles, %d reads of the config center, %d Lookups named evicted", reconciles.Load(), h.calls("fit", ""), named)
}
