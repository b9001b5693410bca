package externalcache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
)

// batchSource is a BatchSource in memory whose batches can be held at a
// gate, or fail, and which counts its calls.
type batchSource struct {
	mu      sync.Mutex
	values  map[string]string
	fail    error
	gate    chan struct{} // nil: answer at once
	batches [][]string
	singles int
}

func (s *batchSource) Fetch(_ context.Context, k externalcache.Key) (externalcache.Value, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.singles++
	if s.fail != nil {
		return externalcache.Value{}, s.fail
	}
	return s.answer(k.Domain, k.Name)
}

func (s *batchSource) answer(domain, name string) (externalcache.Value, error) {
	v, ok := s.values[domain+"/"+name]
	if !ok {
		return externalcache.Value{}, fmt.Errorf("%s/%s: %w", domain, name, externalcache.ErrNotFound)
	}
	return externalcache.Value{Data: []byte(v), Revision: 1}, nil
}

func (s *batchSource) FetchBatch(ctx context.Context, domain string, names []string) ([]externalcache.Fetched, error) {
	s.mu.Lock()
	gate := s.gate
	s.batches = append(s.batches, names)
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	out := make([]externalcache.Fetched, len(names))
	for i, name := range names {
		out[i].Value, out[i].Err = s.answer(domain, name)
	}
	return out, nil
}

func (s *batchSource) counts() (batches, singles int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.batches), s.singles
}

// TestBatchFailuresAreEveryKeys: a batch that fails with an error worth
// retrying is retried for every key in it (each on its own backoff, so
// alone or with others queued at the time), and each key resolves once
// the source answers; a shard dropped while its batch is under way
// releases every waiter and leaves no flight behind.
func TestBatchFailuresAreEveryKeys(t *testing.T) {
	src := &batchSource{values: map[string]string{}, fail: errors.New("unavailable")}
	var keys []externalcache.Key
	for i := range 10 {
		k := externalcache.Key{Domain: "d", Name: fmt.Sprintf("k%d", i)}
		src.values["d/"+k.Name] = "v" + k.Name
		keys = append(keys, k)
	}
	cache, err := externalcache.New(externalcache.Options{Source: src, MaxBytes: 64 << 20, MaxShards: 2, Workers: 1,
		Retry:   externalcache.RetryOptions{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxAttempts: 100, MaxElapsed: time.Minute},
		Breaker: externalcache.BreakerOptions{ConsecutiveFailures: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = cache.Start(ctx) }()
	if err := cache.AddShard(1); err != nil {
		t.Fatal(err)
	}
	if err := cache.Warm(ctx, 1, keys...); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a few calls failed", func() bool { b, singles := src.counts(); return b+singles >= 3 })
	src.mu.Lock()
	src.fail = nil
	src.mu.Unlock()
	for _, k := range keys {
		l, err := cache.Wait(ctx, 1, k)
		if err != nil || string(l.Value) != "v"+k.Name {
			t.Fatalf("%s after the source recovered: %q, %v", k, l.Value, err)
		}
	}

	// A batch held at the gate when its shard is dropped.
	gate := make(chan struct{})
	src.mu.Lock()
	src.gate = gate
	src.mu.Unlock()
	defer close(gate)
	if err := cache.AddShard(2); err != nil {
		t.Fatal(err)
	}
	if err := cache.Warm(ctx, 2, keys...); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, len(keys))
	for _, k := range keys {
		go func() {
			_, err := cache.Wait(ctx, 2, k)
			errs <- err
		}()
	}
	eventually(t, "shard 2's batch is under way", func() bool { return cache.Stats().Flights == len(keys) })
	cache.DropShard(2)
	for range keys {
		// A waiter that came after the drop finds the shard not held.
		if err := <-errs; !errors.Is(err, externalcache.ErrShardDropped) && !errors.Is(err, externalcache.ErrShardNotHeld) {
			t.Errorf("a waiter of the dropped shard got %v, want ErrShardDropped", err)
		}
	}
	eventually(t, "no flight is left", func() bool { return cache.Stats().Flights == 0 })
}
