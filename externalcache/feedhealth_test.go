package externalcache_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configcenter/standin"
)

// healthLog records OnFeedHealth calls.
type healthLog struct {
	mu    sync.Mutex
	calls map[string]int
}

func (l *healthLog) record(_ int32, domain string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[domain]++
}

func (l *healthLog) count(domain string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[domain]
}

// unhealthyFeeds reads kshard_externalcache_unhealthy_feeds for one reason.
func unhealthyFeeds(t *testing.T, reason string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "kshard_externalcache_unhealthy_feeds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("kshard_externalcache_unhealthy_feeds{reason=%q} is not registered", reason)
	return 0
}

// TestUnhealthyFeedFallsBackToTTL: a change feed that fails, answers long polls at once with
// nothing changed (a proxy without long polls), or alternates between two histories (a load
// balancer) never reports a change, so a cached value would stay as it is until its hard TTL and
// nobody would be told. While it is so, the cache calls it unhealthy (OnFeedHealth, the gauge,
// Lookup.FeedErr), refreshes what was read on its soft TTL and notifies the change; once the
// feed heals it says so and stops refreshing on the TTL.
func TestUnhealthyFeedFallsBackToTTL(t *testing.T) {
	for _, tc := range []struct {
		reason string
		fault  configcenter.Faults
	}{
		{"failing", configcenter.Faults{FailPolls: true}},
		{"short_polls", configcenter.Faults{ShortPolls: true}},
		{"epoch_flapping", configcenter.Faults{AlternateEpochs: true}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			health := &healthLog{calls: map[string]int{}}
			const softTTL = 500 * time.Millisecond
			// Long polls of a second, so that a fault set while one waits applies soon.
			server := standin.Options{MaxPollTimeout: time.Second}
			h := newHarness(t, setup{feed: true, server: server, opts: func(o *externalcache.Options) {
				o.SoftTTL, o.HardTTL, o.TTLJitter = softTTL, time.Hour, 0.01
				o.OnFeedHealth = health.record
				// An answer without changes sooner than this was not held open.
				o.FeedRetry.MinInterval = 300 * time.Millisecond
				o.FeedHealth.EpochStableFor, o.FeedHealth.FailingFor = time.Second, time.Second
			}})
			k := externalcache.Key{Domain: "health", Name: "k"}
			h.put(k.Domain, k.Name, "v1")
			if l := h.wait(0, k); string(l.Value) != "v1" || l.FeedErr != nil {
				t.Fatalf("Wait = %+v, want v1 with a healthy feed", l)
			}
			eventually(t, "the feed lists the domain", func() bool {
				_, known := h.cache.KeyExists(k)
				return known
			})

			h.setFaults(tc.fault)
			eventually(t, "the feed is called unhealthy", func() bool {
				return health.count(k.Domain) == 1 && unhealthyFeeds(t, tc.reason) == 1
			})
			// What the controller does when told: read the domain's keys again.
			l := h.cache.Get(0, k)
			if !errors.Is(l.FeedErr, externalcache.ErrFeedUnhealthy) || string(l.Value) != "v1" {
				t.Fatalf("Get of a key of an unhealthy feed = %+v, want v1 with FeedErr", l)
			}
			t.Logf("FeedErr: %v", l.FeedErr)
			if _, known := h.cache.KeyExists(k); known {
				t.Error("KeyExists answers from an unhealthy feed's list")
			}

			// Nobody reads the key again: the change must reach the cache and OnUpdate on
			// the value's soft TTL all the same.
			notified := h.updates.count(k)
			h.put(k.Domain, k.Name, "v2")
			eventually(t, "the change is notified", func() bool { return h.updates.count(k) > notified })
			if l := h.cache.Get(0, k); string(l.Value) != "v2" || l.State != externalcache.StateFresh {
				t.Fatalf("Get after the notification = %+v, want v2, fresh", l)
			}

			h.setFaults(configcenter.Faults{})
			eventually(t, "the feed is called healthy again", func() bool {
				return health.count(k.Domain) == 2 && unhealthyFeeds(t, tc.reason) == 0
			})
			if l := h.cache.Get(0, k); l.FeedErr != nil {
				t.Errorf("Get after the feed healed = %+v, want no FeedErr", l)
			}
			// Back to feed-driven refresh: nothing is refreshed on the TTL any more (once
			// a refresh that started before the heal is done).
			eventually(t, "no fetch under way", func() bool { return h.cache.Stats().Flights == 0 })
			refreshes := counter(t, "kshard_externalcache_feed_fallback_refreshes_total")
			calls := h.calls(k.Domain, k.Name)
			time.Sleep(4 * softTTL)
			if got := counter(t, "kshard_externalcache_feed_fallback_refreshes_total"); got != refreshes {
				t.Errorf("%v refreshes on the TTL after the feed healed", got-refreshes)
			}
			if got := h.calls(k.Domain, k.Name); got != calls {
				t.Errorf("%d reads of %s after the feed healed, want none", got-calls, k)
			}
		})
	}
}
