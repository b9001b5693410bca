package externalcache_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/configcenter"
)

// TestFetchGoesThroughTheGuards: Fetch, the read of a caller that keeps values elsewhere (the
// mirror), is stopped by the same circuit breaker and Retry-After hold as the cache's own
// fetches: during an outage the config center sees as many calls as open the breaker, and
// during a Retry-After none, however often Fetch is called.
func TestFetchGoesThroughTheGuards(t *testing.T) {
	const trip = 3
	ctx := context.Background()
	key := externalcache.Key{Domain: "guarded", Name: "k"}

	t.Run("breaker", func(t *testing.T) {
		h := newHarness(t, setup{opts: func(o *externalcache.Options) {
			o.Breaker = externalcache.BreakerOptions{ConsecutiveFailures: trip, Timeout: time.Hour}
		}})
		h.put(key.Domain, key.Name, "v1")
		if v, err := h.cache.Fetch(ctx, key); err != nil || string(v.Data) != "v1" {
			t.Fatalf("Fetch = %q, %v; want v1", v.Data, err)
		}
		if _, err := h.cache.Fetch(ctx, externalcache.Key{Domain: key.Domain, Name: "missing"}); !errors.Is(err, externalcache.ErrNotFound) {
			t.Fatalf("Fetch of a missing key: %v, want ErrNotFound", err)
		}
		h.srv.ResetStats()
		h.setFaults(configcenter.Faults{Outage: true})
		open := 0
		for range 4 * trip {
			if _, err := h.cache.Fetch(ctx, key); errors.Is(err, externalcache.ErrCircuitOpen) {
				open++
			} else if err == nil {
				t.Fatal("Fetch succeeded during the outage")
			}
		}
		if calls := h.calls(key.Domain, key.Name); calls != trip {
			t.Errorf("%d fetches during the outage reached the config center %d times, want %d (the breaker's trip)", 4*trip, calls, trip)
		}
		if open != 3*trip {
			t.Errorf("%d fetches failed with ErrCircuitOpen, want %d", open, 3*trip)
		}
	})

	t.Run("retry-after", func(t *testing.T) {
		h := newHarness(t, setup{opts: func(o *externalcache.Options) { o.MaxRetryAfter = time.Hour }})
		h.put(key.Domain, key.Name, "v1")
		h.setFaults(configcenter.Faults{Outage: true, RetryAfter: configcenter.Duration{Duration: time.Hour}})
		h.srv.ResetStats()
		for range 5 {
			_, err := h.cache.Fetch(ctx, key)
			if err == nil {
				t.Fatal("Fetch succeeded during the outage")
			}
		}
		_, err := h.cache.Fetch(ctx, key)
		var hint externalcache.RetryAfterHinter
		if !errors.Is(err, externalcache.ErrRetryAfterHold) || !errors.As(err, &hint) || hint.RetryAfterHint() <= 0 {
			t.Errorf("Fetch during the hold: %v, want ErrRetryAfterHold with the wait left", err)
		}
		if calls := h.calls(key.Domain, key.Name); calls != 1 {
			t.Errorf("6 fetches under a Retry-After of an hour reached the config center %d times, want 1", calls)
		}
	})
}
