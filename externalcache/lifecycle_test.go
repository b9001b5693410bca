package externalcache_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configcenter/standin"
)

// seedEnv replays one run of TestShardLifecycleKeysResolve: KSHARD_CACHE_SEED=<the logged seed>.
const seedEnv = "KSHARD_CACHE_SEED"

// TestShardLifecycleKeysResolve drives the cache through random interleavings of AddShard,
// DropShard, ReleaseDomain, Warm, Get, Wait and changes of the config center (through the change feed), with a
// queue small enough that Warm and Wait wait for room while shards are dropped under them. After
// each round every shard is added again, and then every key read in any shard must resolve: no
// fetch of an earlier tenure of a shard may block its keys in a later one. The operations are
// chosen from the logged seed; the goroutines' interleaving is the scheduler's.
func TestShardLifecycleKeysResolve(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, seedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 0x6b7368617264))

	const (
		shards = 4
		rounds = 20
		steps  = 250 // operations per round: 5,000 in all
	)
	h := newHarness(t, setup{feed: true, opts: func(o *externalcache.Options) {
		o.Logger = logr.Discard() // hundreds of drops; a failure names the seed to replay
		o.MaxShards = shards
		o.Workers, o.QueueSize = 2, 3
		o.RateLimit = 10000
		o.Retry = externalcache.RetryOptions{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond,
			FailureRetryInterval: 20 * time.Millisecond}
	}})
	// Each call takes a little while, so the small queue is often full.
	h.setFaults(configcenter.Faults{Latency: configcenter.Duration{Duration: 200 * time.Microsecond},
		Jitter: configcenter.Duration{Duration: time.Millisecond}})
	var keys []externalcache.Key
	for d := range 2 {
		for n := range 8 {
			k := externalcache.Key{Domain: fmt.Sprintf("life%d", d), Name: fmt.Sprintf("k%d", n)}
			keys = append(keys, k)
			if n < 6 { // two keys per domain do not exist until a change creates them
				h.put(k.Domain, k.Name, "v0")
			}
		}
	}
	pick := func() externalcache.Key { return keys[rng.IntN(len(keys))] }
	// An operation may fail only because its shard is not held (any more) or was dropped under it.
	expected := func(err error) bool {
		return err == nil || errors.Is(err, externalcache.ErrShardNotHeld) || errors.Is(err, externalcache.ErrShardDropped)
	}

	var async sync.WaitGroup
	var failMu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		failMu.Lock()
		defer failMu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ops := map[string]int{}
	for round := range rounds {
		for range steps {
			s := int32(rng.IntN(shards))
			switch op := rng.IntN(100); {
			case op < 12:
				ops["add"]++
				if err := h.cache.AddShard(s); err != nil {
					t.Fatalf("seed %d: AddShard(%d): %v", seed, s, err)
				}
			case op < 22:
				ops["drop"]++
				h.cache.DropShard(s)
			case op < 34:
				ops["warm"]++
				warm := make([]externalcache.Key, 1+rng.IntN(len(keys)))
				for i := range warm {
					warm[i] = pick()
				}
				async.Go(func() {
					if err := h.cache.Warm(ctx, s, warm...); !expected(err) {
						fail("Warm(%d): %v", s, err)
					}
				})
			case op < 44:
				ops["wait"]++
				k := pick()
				async.Go(func() {
					if _, err := h.cache.Wait(ctx, s, k); !expected(err) {
						fail("Wait(%d, %s): %v", s, k, err)
					}
				})
			case op < 50:
				ops["release"]++
				h.cache.ReleaseDomain(s, pick().Domain)
			case op < 56:
				ops["change"]++
				k := pick()
				if rng.IntN(4) == 0 {
					_, _ = h.srv.Delete(k.Domain, k.Name) // a key already missing stays missing
				} else {
					h.put(k.Domain, k.Name, fmt.Sprintf("r%d", round))
				}
			default:
				ops["get"]++
				if l := h.cache.Get(s, pick()); !expected(l.Err) && !errors.Is(l.Err, externalcache.ErrQueueFull) {
					fail("Get(%d): %+v", s, l)
				}
			}
			if rng.IntN(8) == 0 {
				time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
			}
		}
		// Every Warm and Wait ends: a dropped shard releases them.
		async.Wait()
		for s := range int32(shards) {
			if err := h.cache.AddShard(s); err != nil {
				t.Fatalf("seed %d: AddShard(%d): %v", seed, s, err)
			}
		}
		if n := h.cache.FlightsOfDroppedShards(); n > 0 {
			t.Errorf("seed %d, round %d: %d fetches of dropped shards are still kept", seed, round, n)
		}
		// A feed runs for exactly the domains some held shard uses: releases and drops racing
		// with reads neither leak a feed nor stop one in use.
		used := map[string]bool{}
		for s := range int32(shards) {
			for _, d := range h.cache.Domains(s) {
				used[d] = true
			}
		}
		if feeds := h.cache.FeedDomains(); !slices.Equal(feeds, slices.Sorted(maps.Keys(used))) {
			t.Errorf("seed %d, round %d: feeds of %v, domains used %v", seed, round, feeds, slices.Sorted(maps.Keys(used)))
		}
		for s := range int32(shards) {
			for _, k := range keys {
				l, err := h.cache.Wait(ctx, s, k)
				if err != nil || l.State == externalcache.StatePending {
					t.Fatalf("seed %d, round %d: key %s of shard %d after the last AddShard = %+v, %v; want it resolved",
						seed, round, k, s, l, err)
				}
			}
		}
		failMu.Lock()
		if len(failures) > 0 {
			t.Fatalf("seed %d, round %d: %v", seed, round, failures)
		}
		failMu.Unlock()
	}
	eventually(t, "every fetch ends", func() bool { return h.cache.Stats().Flights == 0 })
	if n := gaugeSum(t, "kshard_external_fetches_in_flight"); n != 0 {
		t.Errorf("kshard_external_fetches_in_flight sums to %v once every fetch ended, want 0", n)
	}
	t.Logf("operations: %v", ops)
}

// TestWarmWokenByDropShardLeavesNoFetch is the race TestShardLifecycleKeysResolve finds, step by
// step: a Warm waiting for room when its shard is dropped must not enqueue a fetch for the dropped
// shard, which no worker would complete and which would block the key in the shard's next tenure.
func TestWarmWokenByDropShardLeavesNoFetch(t *testing.T) {
	srv, err := standin.Start(context.Background(), standin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	a := externalcache.Key{Domain: "race", Name: "a"}
	b := externalcache.Key{Domain: "race", Name: "b"}
	for _, k := range []externalcache.Key{a, b} {
		if _, err := srv.Put(k.Domain, k.Name, k.Name); err != nil {
			t.Fatal(err)
		}
	}
	c, err := externalcache.New(externalcache.Options{
		Source:    configcenter.NewCacheSource(newClient(t, srv.URL(), caller)),
		QueueSize: 1, Workers: 1, MaxBytes: 4 << 20, MaxShards: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddShard(0); err != nil {
		t.Fatal(err)
	}
	// Not started: nothing drains the queue, so Warm waits for room.
	if l := c.Get(0, a); l.State != externalcache.StatePending || l.Err != nil {
		t.Fatalf("Get = %+v, want Pending", l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	warmed := make(chan error, 1)
	go func() { warmed <- c.Warm(ctx, 0, b) }()
	eventually(t, "Warm waits for room", c.WaitingForRoom)

	c.DropShard(0)
	if err := <-warmed; !errors.Is(err, externalcache.ErrShardDropped) {
		t.Errorf("Warm of a shard dropped under it returned %v, want ErrShardDropped", err)
	}
	if n := c.FlightsOfDroppedShards(); n != 0 {
		t.Errorf("%d fetches of the dropped shard are kept", n)
	}
	if err := c.AddShard(0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for _, k := range []externalcache.Key{a, b} {
		if l, err := c.Wait(ctx, 0, k); err != nil || l.State != externalcache.StateFresh {
			t.Errorf("%s in the shard's next tenure = %+v, %v; want Fresh", k, l, err)
		}
	}
}
