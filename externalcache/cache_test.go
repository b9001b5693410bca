package externalcache_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configcenter/standin"
)

// caller is how the cache under test identifies itself to the config center, so that the
// config center's own counts are the calls the cache made.
const caller = "cache"

// harness is a config center on a loopback port and a running cache reading from it.
type harness struct {
	t       *testing.T
	srv     *standin.Server
	client  *configcenter.Client
	cache   *externalcache.Cache
	updates *updateLog
	clock   *fakeClock
}

type setup struct {
	feed      bool
	fakeClock bool
	server    standin.Options
	opts      func(*externalcache.Options)
}

func newHarness(t *testing.T, s setup) *harness {
	t.Helper()
	srv, err := standin.Start(context.Background(), s.server)
	if err != nil {
		t.Fatalf("starting the config center: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	h := &harness{t: t, srv: srv, updates: &updateLog{counts: map[externalcache.Key]int{}}}
	h.client = newClient(t, srv.URL(), caller)
	src := configcenter.NewCacheSource(h.client)
	opts := externalcache.Options{
		Source:   src,
		OnUpdate: h.updates.record,
		Logger:   testr.NewWithOptions(t, testr.Options{Verbosity: 1}),
		// Defaults sized for a controller are too big for many test processes.
		MaxBytes:       16 << 20,
		MaxShards:      4,
		InternalShards: 4,
		FeedRetry:      externalcache.FeedRetryOptions{BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MinInterval: 10 * time.Millisecond},
	}
	if s.feed {
		opts.Feed = src
	}
	if s.fakeClock {
		h.clock = &fakeClock{}
		h.clock.now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
		opts.Clock = h.clock
	}
	if s.opts != nil {
		s.opts(&opts)
	}
	c, err := externalcache.New(opts)
	if err != nil {
		t.Fatalf("creating the cache: %v", err)
	}
	h.cache = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cache Start returned %v", err)
		}
	})
	// A controller adds a shard when it starts it; the tests hold the
	// first ones (at most four, the shard count of TestGetNeverCallsTheSourceItself).
	for n := range int32(min(opts.MaxShards, 4)) {
		if err := c.AddShard(n); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func newClient(t *testing.T, url, name string) *configcenter.Client {
	t.Helper()
	c, err := configcenter.NewClient(configcenter.ClientOptions{BaseURL: url, Caller: name})
	if err != nil {
		t.Fatalf("creating a client: %v", err)
	}
	return c
}

// calls is the number of key reads the config center answered to the cache for a domain
// (and key, when given), from the config center's own records.
func (h *harness) calls(domain, key string) int {
	return len(h.srv.Requests(func(r configcenter.RequestRecord) bool {
		return r.Caller == caller && r.Route == configcenter.RouteGetKey && r.Domain == domain && (key == "" || r.Key == key)
	}))
}

func (h *harness) put(domain, key, value string) configcenter.Value {
	h.t.Helper()
	v, err := h.srv.Put(domain, key, value)
	if err != nil {
		h.t.Fatalf("putting %s/%s: %v", domain, key, err)
	}
	return v
}

func (h *harness) setFaults(f configcenter.Faults) {
	h.t.Helper()
	if err := h.srv.SetFaults(f); err != nil {
		h.t.Fatalf("setting faults: %v", err)
	}
}

func (h *harness) wait(shard int32, key externalcache.Key) externalcache.Lookup {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := h.cache.Wait(ctx, shard, key)
	if err != nil {
		h.t.Fatalf("waiting for %s: %v", key, err)
	}
	return l
}

// eventually polls cond with a generous bound. It is a way to wait for asynchronous work, never
// an assertion about how fast that work is.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, 30*time.Second, what, cond)
}

// eventuallyWithin is eventually with another bound, for work that a
// loaded machine stretches (thousands of fetches under -race).
func eventuallyWithin(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) Now() time.Time                  { return time.Unix(0, c.now.Load()) }
func (c *fakeClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *fakeClock) Advance(d time.Duration)         { c.now.Add(int64(d)) }

type updateLog struct {
	mu     sync.Mutex
	counts map[externalcache.Key]int
}

func (u *updateLog) record(_ int32, k externalcache.Key) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.counts[k]++
}

func (u *updateLog) count(k externalcache.Key) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[k]
}

func TestStampedeOfMissesMakesOneCall(t *testing.T) {
	h := newHarness(t, setup{feed: true})
	key := externalcache.Key{Domain: "stampede", Name: "hot"}
	h.put(key.Domain, key.Name, "v1")
	// Keep the one fetch in flight while the herd arrives.
	h.setFaults(configcenter.Faults{Latency: configcenter.Duration{Duration: 200 * time.Millisecond}})

	const n = 1000
	start := make(chan struct{})
	gets := make([]externalcache.Lookup, n)
	waits := make([]externalcache.Lookup, n)
	waitErrs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { <-start; gets[i] = h.cache.Get(0, key) })
		wg.Go(func() { <-start; waits[i], waitErrs[i] = h.cache.Wait(ctx, 0, key) })
	}
	close(start)
	wg.Wait()

	pending := 0
	for i := range n {
		switch g := gets[i]; {
		case g.State == externalcache.StatePending && g.Err == nil:
			pending++
		case g.State == externalcache.StateFresh && string(g.Value) == "v1":
		default:
			t.Fatalf("Get %d = %+v, want Pending or Fresh v1", i, g)
		}
		if w := waits[i]; waitErrs[i] != nil || w.State != externalcache.StateFresh || string(w.Value) != "v1" || w.Revision != 1 {
			t.Fatalf("Wait %d = %+v, %v; want Fresh v1 at revision 1", i, w, waitErrs[i])
		}
	}
	if got := h.calls(key.Domain, key.Name); got != 1 {
		t.Errorf("config center answered %d reads of %s to %d concurrent Gets and %d Waits, want exactly 1", got, key, n, n)
	}
	// The notifier calls OnUpdate from its own goroutine: the waiters may
	// be released before it runs.
	eventually(t, "OnUpdate for the arrival", func() bool { return h.updates.count(key) > 0 })
	if got := h.updates.count(key); got != 1 {
		t.Errorf("OnUpdate fired %d times for the arrival of %s, want 1", got, key)
	}
	t.Logf("%d of %d Gets found the key pending", pending, n)
}

func TestStaleValueIsServedWhileOneRefreshRuns(t *testing.T) {
	h := newHarness(t, setup{fakeClock: true, opts: func(o *externalcache.Options) {
		o.SoftTTL, o.TTLJitter, o.HardTTL = time.Minute, 0.1, time.Hour
	}})
	key := externalcache.Key{Domain: "swr", Name: "k"}
	h.put(key.Domain, key.Name, "old")
	if l := h.wait(0, key); l.State != externalcache.StateFresh || string(l.Value) != "old" {
		t.Fatalf("first Wait = %+v, want Fresh old", l)
	}
	// Notifications of a key still waiting to be delivered are delivered
	// once: under load, the arrival's would otherwise take in the change's.
	eventually(t, "OnUpdate for the arrival", func() bool { return h.updates.count(key) > 0 })
	h.put(key.Domain, key.Name, "new") // no feed: only expiry can reveal it
	if l := h.cache.Get(0, key); l.State != externalcache.StateFresh || string(l.Value) != "old" {
		t.Fatalf("Get before soft expiry = %+v, want Fresh old", l)
	}
	h.clock.Advance(2 * time.Minute) // past SoftTTL + jitter, far from HardTTL

	l := h.cache.Get(0, key)
	if l.State != externalcache.StateStale || string(l.Value) != "old" {
		t.Fatalf("Get after soft expiry = %+v, want Stale old at once", l)
	}
	eventually(t, "the refresh lands", func() bool {
		l := h.cache.Get(0, key)
		switch {
		case l.State == externalcache.StateFresh && string(l.Value) == "new":
			return true
		case l.State == externalcache.StateStale && string(l.Value) == "old":
			return false
		}
		t.Fatalf("Get during the refresh = %+v, want Stale old or Fresh new", l)
		return false
	})
	if got := h.calls(key.Domain, key.Name); got != 2 {
		t.Errorf("config center answered %d reads, want 2: the first fetch and exactly one refresh", got)
	}
	// The notifier calls OnUpdate from its own goroutine, after the value
	// is served.
	eventually(t, "OnUpdate for the change", func() bool { return h.updates.count(key) > 1 })
	if got := h.updates.count(key); got != 2 {
		t.Errorf("OnUpdate fired %d times, want 2 (arrival and change)", got)
	}
}

func TestNotFoundIsCachedUntilItsTTL(t *testing.T) {
	h := newHarness(t, setup{fakeClock: true, opts: func(o *externalcache.Options) { o.NegativeTTL = 30 * time.Second }})
	key := externalcache.Key{Domain: "neg", Name: "missing"}
	if l := h.wait(0, key); l.State != externalcache.StateNotFound || l.Err != nil {
		t.Fatalf("Wait of a missing key = %+v, want NotFound without error", l)
	}
	for range 100 {
		if l := h.cache.Get(0, key); l.State != externalcache.StateNotFound {
			t.Fatalf("Get within the negative TTL = %+v, want NotFound", l)
		}
	}
	h.clock.Advance(29 * time.Second)
	if l := h.cache.Get(0, key); l.State != externalcache.StateNotFound {
		t.Fatalf("Get just before the negative TTL = %+v, want NotFound", l)
	}
	if got := h.calls(key.Domain, key.Name); got != 1 {
		t.Fatalf("config center answered %d reads within the negative TTL, want 1", got)
	}

	h.put(key.Domain, key.Name, "now-here") // no feed: only the negative TTL can reveal it
	h.clock.Advance(2 * time.Second)
	if l := h.cache.Get(0, key); l.State != externalcache.StatePending {
		t.Fatalf("Get after the negative TTL = %+v, want Pending", l)
	}
	if l := h.wait(0, key); l.State != externalcache.StateFresh || string(l.Value) != "now-here" {
		t.Fatalf("Wait after the negative TTL = %+v, want Fresh now-here", l)
	}
	if got := h.calls(key.Domain, key.Name); got != 2 {
		t.Errorf("config center answered %d reads, want 2", got)
	}
}

func TestOutageOpensTheBreakerAndStaleValuesAreServed(t *testing.T) {
	const (
		workers  = 4
		trip     = 3
		probes   = 1
		keyCount = 10
	)
	h := newHarness(t, setup{fakeClock: true, opts: func(o *externalcache.Options) {
		o.Workers = workers
		o.SoftTTL, o.HardTTL = time.Minute, time.Hour
		o.Breaker = externalcache.BreakerOptions{ConsecutiveFailures: trip, Timeout: 200 * time.Millisecond, HalfOpenProbes: probes}
		o.Retry = externalcache.RetryOptions{MaxAttempts: 2, BaseDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond,
			FailureRetryInterval: 50 * time.Millisecond}
	}})
	const domain = "outage"
	keys := make([]externalcache.Key, keyCount)
	for i := range keys {
		keys[i] = externalcache.Key{Domain: domain, Name: fmt.Sprintf("k%d", i)}
		h.put(domain, keys[i].Name, "before")
		if l := h.wait(0, keys[i]); l.State != externalcache.StateFresh {
			t.Fatalf("Wait %s = %+v", keys[i], l)
		}
	}

	h.srv.ResetStats()
	h.setFaults(configcenter.Faults{Outage: true})
	h.clock.Advance(2 * time.Minute) // every key is stale: every Get wants a refresh
	halfOpensBefore := h.cache.HalfOpens()
	gets, sawOpen := 0, false
	eventually(t, "the breaker opens and lets probes through three times", func() bool {
		for _, k := range keys {
			l := h.cache.Get(0, k)
			gets++
			if l.State != externalcache.StateStale || string(l.Value) != "before" {
				t.Fatalf("Get %s during the outage = %+v, want the stale value", k, l)
			}
			sawOpen = sawOpen || errors.Is(l.Err, externalcache.ErrCircuitOpen)
		}
		return h.cache.HalfOpens()-halfOpensBefore >= 3
	})
	calls := h.srv.Stats().Count(caller, domain, configcenter.RouteGetKey, 0)
	halfOpens := h.cache.HalfOpens() - halfOpensBefore // read after the calls: it can only grow
	// Closed, the breaker admits calls until trip failures are recorded, plus those already in
	// flight on the other workers; open, nothing; half-open, the probes.
	bound := int64(trip+workers-1) + halfOpens*probes
	if calls < trip || calls > bound {
		t.Errorf("config center answered %d reads during the outage (%d Gets, %d half-opens); want %d..%d", calls, gets, halfOpens, trip, bound)
	}
	if !sawOpen {
		t.Error("no stale Get reported ErrCircuitOpen")
	}
	if s := h.srv.Stats().Count(caller, domain, configcenter.RouteGetKey, 503); s != calls {
		t.Errorf("%d of %d calls answered 503", s, calls)
	}

	for _, k := range keys {
		h.put(domain, k.Name, "after")
	}
	h.setFaults(configcenter.Faults{})
	eventually(t, "every key refreshes by itself after recovery", func() bool {
		for _, k := range keys {
			if l := h.cache.Get(0, k); l.State != externalcache.StateFresh || string(l.Value) != "after" || l.Err != nil {
				return false
			}
		}
		return true
	})
	if s := h.cache.Stats(); s.Breaker != "closed" {
		t.Errorf("breaker is %s after recovery, want closed", s.Breaker)
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *externalcache.Options) {
		o.Retry = externalcache.RetryOptions{MaxAttempts: 4, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxElapsed: 30 * time.Second}
	}})
	key := externalcache.Key{Domain: "throttled", Name: "k"}
	h.put(key.Domain, key.Name, "v")
	// One request every two seconds; another client takes this second's token first.
	h.setFaults(configcenter.Faults{RateLimit: 0.5, RateBurst: 1})
	if _, err := newClient(t, h.srv.URL(), "other").Get(context.Background(), key.Domain, key.Name); err != nil {
		t.Fatalf("taking the token: %v", err)
	}
	if l := h.wait(0, key); l.State != externalcache.StateFresh || string(l.Value) != "v" {
		t.Fatalf("Wait = %+v, want Fresh v", l)
	}
	recs := h.srv.Requests(func(r configcenter.RequestRecord) bool {
		return r.Caller == caller && r.Route == configcenter.RouteGetKey && r.Key == key.Name
	})
	if len(recs) < 2 || recs[0].Code != 429 || recs[len(recs)-1].Code != 200 {
		t.Fatalf("calls = %+v, want a 429 first and a 200 last", recs)
	}
	for i := 1; i < len(recs); i++ {
		prev, next := recs[i-1], recs[i]
		if prev.Code != 429 {
			t.Fatalf("call %d answered %d before the last call", i-1, prev.Code)
		}
		if prev.RetryAfter <= 0 {
			t.Fatalf("429 without Retry-After: %+v", prev)
		}
		// Server-side times: the retry arrived no earlier than Retry-After after the 429 was sent.
		if gap := next.Arrived.Sub(prev.Done); gap < prev.RetryAfter {
			t.Errorf("call %d arrived %s after a 429 asking for %s", i, gap, prev.RetryAfter)
		}
	}
}

func TestChangeFeedRefreshesWithoutExpiry(t *testing.T) {
	h := newHarness(t, setup{feed: true, opts: func(o *externalcache.Options) {
		o.SoftTTL, o.HardTTL, o.NegativeTTL = 10*time.Hour, 20*time.Hour, 10*time.Hour
	}})
	ctx := context.Background()
	k := externalcache.Key{Domain: "feed", Name: "k"}
	missing := externalcache.Key{Domain: "feed", Name: "later"}
	h.put(k.Domain, k.Name, "v1")
	if l := h.wait(3, k); string(l.Value) != "v1" {
		t.Fatalf("Wait = %+v", l)
	}
	if l := h.wait(3, missing); l.State != externalcache.StateNotFound {
		t.Fatalf("Wait of a missing key = %+v", l)
	}
	eventually(t, "the feed runs", func() bool { return h.cache.Stats().FeedLoops == 1 })
	// A notification not yet delivered takes in the next one of its key:
	// wait for the arrivals', or a loaded machine counts one fewer.
	eventually(t, "OnUpdate for the arrivals", func() bool { return h.updates.count(k) > 0 && h.updates.count(missing) > 0 })

	if _, err := h.client.Put(ctx, k.Domain, k.Name, "v2"); err != nil {
		t.Fatal(err)
	}
	// At least two notifications: the fetch's and the change's. A feed whose
	// first answer (listing k) lands before k's first fetch is under way
	// notifies once more, harmlessly: the machine's timing decides that.
	eventually(t, "the change reaches the cache and OnUpdate", func() bool {
		l := h.cache.Get(3, k)
		return l.State == externalcache.StateFresh && string(l.Value) == "v2" && h.updates.count(k) >= 2
	})
	if got := h.calls(k.Domain, k.Name); got != 2 {
		t.Errorf("config center answered %d reads of %s, want 2 (fetch and one refresh)", got, k)
	}

	if _, err := h.client.Put(ctx, missing.Domain, missing.Name, "created"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a created key replaces its cached not-found", func() bool {
		l := h.cache.Get(3, missing)
		return l.State == externalcache.StateFresh && string(l.Value) == "created" && h.updates.count(missing) == 2
	})

	if _, err := h.client.Delete(ctx, k.Domain, k.Name); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deletion reaches the cache", func() bool {
		return h.cache.Get(3, k).State == externalcache.StateNotFound && h.updates.count(k) >= 3
	})
}

func TestChangeFeedSurvivesAConfigCenterRestart(t *testing.T) {
	h := newHarness(t, setup{feed: true, opts: func(o *externalcache.Options) {
		o.SoftTTL, o.HardTTL = 10*time.Hour, 20*time.Hour
	}})
	k := externalcache.Key{Domain: "restart", Name: "k"}
	for i := range 5 { // a history the restarted server will not have
		h.put(k.Domain, k.Name, fmt.Sprintf("v%d", i))
	}
	if l := h.wait(0, k); string(l.Value) != "v4" || l.Revision != 5 {
		t.Fatalf("Wait = %+v", l)
	}
	eventually(t, "the feed waits on the server", func() bool { return h.srv.WaitingPolls() == 1 })

	addr := h.srv.Addr()
	if err := h.srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv, err := standin.Start(context.Background(), standin.Options{Addr: addr})
	if err != nil {
		t.Fatalf("restarting the config center on %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	h.srv = srv
	if v, _ := srv.Put(k.Domain, k.Name, "after-restart"); v.Revision >= 5 {
		t.Fatalf("restarted server is at revision %d; the test needs a lower one", v.Revision)
	}
	eventually(t, "the feed resynchronises and refreshes the key", func() bool {
		l := h.cache.Get(0, k)
		return l.State == externalcache.StateFresh && string(l.Value) == "after-restart"
	})
}

func TestBytesStayBoundedAndOversizedValuesAreRefused(t *testing.T) {
	const (
		maxBytes  = 1 << 20
		keys      = 4000
		valueSize = 2048 // 8 MiB in all, eight times the bound
	)
	h := newHarness(t, setup{
		server: standin.Options{Seed: configcenter.SeedOptions{Domains: 1, KeysPerDomain: keys, ValueBytes: valueSize}},
		opts: func(o *externalcache.Options) {
			o.MaxBytes, o.MaxShards, o.InternalShards, o.MaxEntryBytes = maxBytes, 1, 4, 64<<10
			o.RateLimit = 5000
		},
	})
	domain := configcenter.SeedDomain(0)
	all := make([]externalcache.Key, keys)
	for i := range all {
		all[i] = externalcache.Key{Domain: domain, Name: configcenter.SeedKey(i)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.cache.Warm(ctx, 0, all...); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	// 4,000 fetches over HTTP: under two make test runs at once they took
	// longer than 30 s.
	eventuallyWithin(t, 2*time.Minute, "every fetch completes", func() bool {
		s := h.cache.Stats()
		return s.Flights == 0 && s.QueueDepth == 0
	})
	if got := h.calls(domain, ""); got < keys {
		t.Fatalf("config center answered %d reads, want at least %d", got, keys)
	}
	s := h.cache.Stats()
	if s.Bytes > maxBytes || s.Bytes == 0 {
		t.Errorf("cache holds %d bytes for %d × %d bytes of values, want 1..%d", s.Bytes, keys, valueSize, maxBytes)
	}
	if s.Entries >= keys || s.Entries == 0 {
		t.Errorf("cache holds %d of %d entries; it should have evicted the oldest", s.Entries, keys)
	}
	if g := gauge(t, "kshard_externalcache_bytes"); g > maxBytes || g != float64(s.Bytes) {
		t.Errorf("kshard_externalcache_bytes = %v, want %d (at most %d)", g, s.Bytes, maxBytes)
	}
	if g := gauge(t, "kshard_externalcache_entries"); g != float64(s.Entries) {
		t.Errorf("kshard_externalcache_entries = %v, want %d", g, s.Entries)
	}
	// The newest keys survived eviction and are served.
	if l := h.cache.Get(0, all[keys-1]); l.State != externalcache.StateFresh || len(l.Value) != valueSize {
		t.Errorf("Get of the last key = %v with %d bytes, want Fresh with %d", l.State, len(l.Value), valueSize)
	}

	big := externalcache.Key{Domain: domain, Name: "big"}
	h.put(big.Domain, big.Name, strings.Repeat("b", 100<<10))
	l, err := h.cache.Wait(ctx, 0, big)
	if !errors.Is(err, externalcache.ErrEntryTooLarge) || !errors.Is(l.Err, externalcache.ErrEntryTooLarge) || l.State != externalcache.StatePending {
		t.Fatalf("Wait of a 100 KiB value = %+v, %v; want Pending with ErrEntryTooLarge", l, err)
	}
	if msg := err.Error(); !strings.Contains(msg, big.String()) || !strings.Contains(msg, "102400") {
		t.Errorf("error %q does not name the key and its size", msg)
	}
	for range 10 {
		if l := h.cache.Get(0, big); !errors.Is(l.Err, externalcache.ErrEntryTooLarge) {
			t.Fatalf("Get of the oversized key = %+v, want its error", l)
		}
	}
	if got := h.calls(domain, big.Name); got != 1 {
		t.Errorf("config center answered %d reads of the oversized key, want 1 (refused, not retried at once)", got)
	}
}

func TestDropShardDropsExactlyItsEntriesFetchesAndFeeds(t *testing.T) {
	h := newHarness(t, setup{feed: true})
	a := externalcache.Key{Domain: "alpha", Name: "k"}
	b := externalcache.Key{Domain: "beta", Name: "k"}
	shared := externalcache.Key{Domain: "shared", Name: "k"}
	for _, k := range []externalcache.Key{a, b, shared} {
		h.put(k.Domain, k.Name, "v")
	}
	h.wait(1, a)
	h.wait(1, shared)
	h.wait(2, b)
	h.wait(2, shared)
	if got := strings.Join(h.cache.FeedDomains(), ","); got != "alpha,beta,shared" {
		t.Fatalf("feeds = %s, want alpha,beta,shared", got)
	}
	eventually(t, "three feed loops run", func() bool { return h.cache.Stats().FeedLoops == 3 })
	entriesBefore := h.cache.Stats().Entries

	// A fetch for shard 1 that is still under way when the shard is dropped.
	slow := externalcache.Key{Domain: "alpha", Name: "slow"}
	h.put(slow.Domain, slow.Name, "v")
	h.setFaults(configcenter.Faults{Latency: configcenter.Duration{Duration: time.Second}})
	waitErr := make(chan error, 1)
	go func() {
		_, err := h.cache.Wait(context.Background(), 1, slow)
		waitErr <- err
	}()
	eventually(t, "the slow fetch is under way", func() bool { return h.cache.Stats().Flights == 1 })

	h.cache.DropShard(1)

	if err := <-waitErr; !errors.Is(err, externalcache.ErrShardDropped) {
		t.Errorf("waiter of a dropped shard got %v, want ErrShardDropped", err)
	}
	if got := h.cache.Shards(); !slices.Equal(got, []int32{0, 2, 3}) {
		t.Errorf("shards after DropShard(1) = %v, want [0 2 3]", got)
	}
	if got := strings.Join(h.cache.FeedDomains(), ","); got != "beta,shared" {
		t.Errorf("feeds after DropShard(1) = %s, want beta,shared", got)
	}
	eventually(t, "alpha's feed loop stops", func() bool { return h.cache.Stats().FeedLoops == 2 })
	if s := h.cache.Stats(); s.Flights != 0 {
		t.Errorf("after DropShard(1): %d flights, want 0", s.Flights)
	}
	// The sweeper deletes the dropped shard's entries in the background.
	eventually(t, "shard 1's two entries are deleted", func() bool { return h.cache.Stats().Entries == entriesBefore-2 })
	h.setFaults(configcenter.Faults{})
	callsBefore := h.calls("beta", "") + h.calls("shared", "")
	for _, k := range []externalcache.Key{b, shared} {
		if l := h.cache.Get(2, k); l.State != externalcache.StateFresh {
			t.Errorf("shard 2's %s after dropping shard 1 = %+v, want Fresh", k, l)
		}
	}
	if got := h.calls("beta", "") + h.calls("shared", ""); got != callsBefore {
		t.Errorf("shard 2's keys were fetched again (%d calls, want %d)", got, callsBefore)
	}
	if l := h.cache.Get(1, a); !errors.Is(l.Err, externalcache.ErrShardNotHeld) {
		t.Errorf("shard 1's %s after the drop = %+v, want ErrShardNotHeld: a dropped shard is not re-created", a, l)
	}
	if err := h.cache.Warm(context.Background(), 1, a); !errors.Is(err, externalcache.ErrShardNotHeld) {
		t.Errorf("warming the dropped shard: %v, want ErrShardNotHeld", err)
	}
	if err := h.cache.AddShard(1); err != nil {
		t.Fatal(err)
	}
	if l := h.cache.Get(1, a); l.State != externalcache.StatePending {
		t.Errorf("shard 1's %s after adding it again = %+v, want Pending: its entries are gone", a, l)
	}
	for _, n := range []int32{0, 1, 2, 3} {
		h.cache.DropShard(n)
	}
	eventually(t, "every feed loop stops and every entry is deleted", func() bool {
		s := h.cache.Stats()
		return s.FeedLoops == 0 && s.Entries == 0
	})
	if s := h.cache.Stats(); s.Shards != 0 || len(h.cache.FeedDomains()) != 0 {
		t.Errorf("after dropping every shard: %+v, feeds %v", s, h.cache.FeedDomains())
	}
}

func TestGetNeverCallsTheSourceItself(t *testing.T) {
	h := newHarness(t, setup{})
	// The cache is started; make the source hang so that a Get doing I/O would hang with it.
	h.setFaults(configcenter.Faults{Latency: configcenter.Duration{Duration: time.Minute}})
	key := externalcache.Key{Domain: "slow", Name: "k"}
	for range 100 {
		if l := h.cache.Get(0, key); l.State != externalcache.StatePending {
			t.Fatalf("Get = %+v, want Pending", l)
		}
	}
	if l := h.cache.Get(0, externalcache.Key{Domain: "", Name: "k"}); !errors.Is(l.Err, externalcache.ErrInvalidKey) {
		t.Errorf("Get of an invalid key = %+v, want ErrInvalidKey", l)
	}
	if l := h.cache.Get(-1, key); l.Err == nil {
		t.Errorf("Get of a negative shard = %+v, want an error", l)
	}
	if l := h.cache.Get(4, key); !errors.Is(l.Err, externalcache.ErrShardNotHeld) {
		t.Errorf("Get of a shard never added = %+v, want ErrShardNotHeld", l)
	}
	if err := h.cache.AddShard(4); !errors.Is(err, externalcache.ErrTooManyShards) {
		t.Errorf("adding a fifth shard with MaxShards 4: %v, want ErrTooManyShards", err)
	}
}

// gauge and counter read a metric of one series from controller-runtime's
// registry, where the cache registers its metrics. A metric that is not
// registered fails the test: zero must mean none, not not found.
func gauge(t *testing.T, name string) float64 { t.Helper(); return metricValue(t, name) }

func counter(t *testing.T, name string) float64 { t.Helper(); return metricValue(t, name) }

func metricValue(t *testing.T, name string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			if m := f.GetMetric()[0]; m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("metric %s is not registered", name)
	return 0
}

// gaugeSum adds up every series of a gauge family, whatever their labels.
func gaugeSum(t *testing.T, name string) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() == name {
			var v float64
			for _, m := range f.GetMetric() {
				v += m.GetGauge().GetValue()
			}
			return v
		}
	}
	t.Fatalf("metric %s is not registered", name)
	return 0
}

func TestFailedFetchIsReportedOnceAndRecoversByItself(t *testing.T) {
	h := newHarness(t, setup{opts: func(o *externalcache.Options) {
		o.Breaker.ConsecutiveFailures = 1000 // this test is about retries, not the breaker
		o.Retry = externalcache.RetryOptions{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond,
			FailureRetryInterval: 20 * time.Millisecond}
	}})
	key := externalcache.Key{Domain: "flaky", Name: "k"}
	h.put(key.Domain, key.Name, "v")
	h.setFaults(configcenter.Faults{ErrorRate: 1})

	l, err := h.cache.Wait(context.Background(), 0, key)
	var se *configcenter.StatusError
	if !errors.As(err, &se) || se.Code != 500 || l.State != externalcache.StatePending || !errors.Is(l.Err, err) {
		t.Fatalf("Wait during errors = %+v, %v; want Pending with the 500", l, err)
	}
	if got := h.calls(key.Domain, key.Name); got < 3 {
		t.Errorf("%d calls before giving up, want the 3 attempts", got)
	}
	eventually(t, "the failure is retried in later rounds", func() bool { return h.calls(key.Domain, key.Name) >= 9 })
	// The notifier delivers from its own goroutine; a notification not yet
	// delivered would take in the recovery's.
	eventually(t, "OnUpdate for the failure", func() bool { return h.updates.count(key) > 0 })
	if got := h.updates.count(key); got != 1 {
		t.Errorf("OnUpdate fired %d times over several failed rounds, want once", got)
	}
	if l := h.cache.Get(0, key); l.State != externalcache.StatePending || !errors.As(l.Err, &se) {
		t.Errorf("Get while failing = %+v, want Pending with the last error", l)
	}

	h.setFaults(configcenter.Faults{})
	eventually(t, "the key recovers without another Get", func() bool { return h.updates.count(key) == 2 })
	if l := h.cache.Get(0, key); l.State != externalcache.StateFresh || string(l.Value) != "v" || l.Err != nil {
		t.Errorf("Get after recovery = %+v, want Fresh v without error", l)
	}
}

// TestFailedKeysComeBackWhenTheBreakerCloses: keys whose rounds failed
// during an outage wait an hour for their retry (FailureRetryInterval), yet
// come back as soon as a probe finds the source answering again and closes
// the breaker, without another Get of theirs: the objects that read them
// are not kept unavailable long after the service returned.
func TestFailedKeysComeBackWhenTheBreakerCloses(t *testing.T) {
	const failed = 3
	h := newHarness(t, setup{opts: func(o *externalcache.Options) {
		o.Breaker = externalcache.BreakerOptions{ConsecutiveFailures: failed, Timeout: 100 * time.Millisecond, HalfOpenProbes: 1}
		o.Retry = externalcache.RetryOptions{MaxAttempts: 1, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond,
			FailureRetryInterval: time.Hour}
	}})
	const domain = "recovery"
	keys := make([]externalcache.Key, failed)
	for i := range keys {
		keys[i] = externalcache.Key{Domain: domain, Name: fmt.Sprintf("k%d", i)}
		h.put(domain, keys[i].Name, "v")
	}
	h.setFaults(configcenter.Faults{Outage: true})
	// One round each, one attempt each: three failures open the breaker.
	for _, k := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		l, err := h.cache.Wait(ctx, 0, k)
		cancel()
		if err == nil || l.State != externalcache.StatePending {
			t.Fatalf("Wait %s during the outage = %+v, %v; want Pending with the 503", k, l, err)
		}
	}
	h.setFaults(configcenter.Faults{})
	// Another key's read is the probe that closes the breaker once it is
	// half-open.
	probe := externalcache.Key{Domain: domain, Name: "probe"}
	h.put(domain, probe.Name, "p")
	eventually(t, "a probe closes the breaker", func() bool {
		l := h.cache.Get(0, probe)
		return l.State == externalcache.StateFresh
	})
	eventually(t, "the keys that failed during the outage come back without a Get", func() bool {
		for _, k := range keys {
			if h.updates.count(k) < 2 { // the failure, then the value
				return false
			}
		}
		return true
	})
	for _, k := range keys {
		if l := h.cache.Get(0, k); l.State != externalcache.StateFresh || string(l.Value) != "v" || l.Err != nil {
			t.Errorf("Get %s after recovery = %+v, want Fresh v", k, l)
		}
	}
}

func TestFullQueueIsReportedAndWaitersWaitForRoom(t *testing.T) {
	srv, err := standin.Start(context.Background(), standin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	for _, k := range []string{"a", "b"} {
		if _, err := srv.Put("queue", k, k); err != nil {
			t.Fatal(err)
		}
	}
	c, err := externalcache.New(externalcache.Options{
		Source:    configcenter.NewCacheSource(newClient(t, srv.URL(), caller)),
		QueueSize: 1, Workers: 1, MaxBytes: 4 << 20, MaxShards: 1, InternalShards: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddShard(0); err != nil {
		t.Fatal(err)
	}
	a := externalcache.Key{Domain: "queue", Name: "a"}
	b := externalcache.Key{Domain: "queue", Name: "b"}
	// Not started yet: nothing drains the queue.
	if l := c.Get(0, a); l.State != externalcache.StatePending || l.Err != nil {
		t.Fatalf("first Get = %+v, want Pending", l)
	}
	if l := c.Get(0, b); !errors.Is(l.Err, externalcache.ErrQueueFull) {
		t.Fatalf("Get with a full queue = %+v, want ErrQueueFull", l)
	}
	if s := c.Stats(); s.QueueDepth != 1 || s.Flights != 1 {
		t.Fatalf("stats = %+v, want one queued fetch", s)
	}
	waited := make(chan externalcache.Lookup, 1)
	go func() {
		l, _ := c.Wait(context.Background(), 0, b) // waits for room, then for the fetch
		waited <- l
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	if l := <-waited; l.State != externalcache.StateFresh || string(l.Value) != "b" {
		t.Errorf("Wait through a full queue = %+v, want Fresh b", l)
	}
	if err := c.Warm(context.Background(), 0, a, b); err != nil {
		t.Errorf("Warm: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if l := c.Get(0, externalcache.Key{Domain: "queue", Name: "c"}); !errors.Is(l.Err, externalcache.ErrStopped) {
		t.Errorf("Get of a new key after stop = %+v, want ErrStopped", l)
	}
	if err := c.Start(context.Background()); err == nil {
		t.Error("a second Start succeeded")
	}
}

// TestRunsOnEveryReplica: the cache is a per-replica runnable; without
// NeedLeaderElection()==false the manager would run it on the leader only
// and every other replica's fetches would never happen.
func TestRunsOnEveryReplica(t *testing.T) {
	var r manager.LeaderElectionRunnable = &externalcache.Cache{}
	if r.NeedLeaderElection() {
		t.Fatal("the external cache would run on the leader only")
	}
}

// TestRetryAfterHoldsFeedPolls: a Retry-After the config center sent to a key's fetch holds the
// change feed's polls too, as it holds every other fetch. The feed's waiting poll is answered by
// a change made during the hold; the next poll must not arrive before the hold ends.
func TestRetryAfterHoldsFeedPolls(t *testing.T) {
	const retryAfter = 2 * time.Second
	h := newHarness(t, setup{feed: true, opts: func(o *externalcache.Options) {
		o.Retry = externalcache.RetryOptions{MaxAttempts: 4, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxElapsed: 30 * time.Second}
	}})
	watched := externalcache.Key{Domain: "held", Name: "watched"}
	throttled := externalcache.Key{Domain: "held", Name: "throttled"}
	h.put(watched.Domain, watched.Name, "v1")
	h.put(throttled.Domain, throttled.Name, "v1")
	h.wait(0, watched)
	eventually(t, "the feed waits on the server", func() bool { return h.srv.WaitingPolls() == 1 })

	// One request every hundred seconds; another client takes the token first, so the cache's
	// next fetch is answered 429 with a Retry-After, and so is the feed's next poll, at once. (At
	// one every ten seconds, a loaded run's fetch retries held the feed long enough for its poll
	// to find a token again: the server held that poll open, and recorded it only when its long
	// poll ended, after the wait below.)
	h.setFaults(configcenter.Faults{RateLimit: 0.01, RateBurst: 1, RetryAfter: configcenter.Duration{Duration: retryAfter}})
	if _, err := newClient(t, h.srv.URL(), "other").Get(context.Background(), throttled.Domain, throttled.Name); err != nil {
		t.Fatalf("taking the token: %v", err)
	}
	h.cache.Get(0, throttled)
	var throttledAt configcenter.RequestRecord
	eventually(t, "the fetch is throttled", func() bool {
		recs := h.srv.Requests(func(r configcenter.RequestRecord) bool {
			return r.Caller == caller && r.Route == configcenter.RouteGetKey && r.Code == 429
		})
		if len(recs) > 0 {
			throttledAt = recs[0]
		}
		return len(recs) > 0
	})
	// The server sent the 429; wait until the cache received it (the fetch extends the hold
	// before it records the error the lookup shows): a feed poll sent between the two would be
	// no fault of the hold's.
	eventually(t, "the cache received the 429", func() bool { return h.cache.Get(0, throttled).Err != nil })
	// Wake the waiting poll during the hold.
	h.put(watched.Domain, watched.Name, "v2")
	var polls []configcenter.RequestRecord
	eventually(t, "the feed polls again", func() bool {
		polls = h.srv.Requests(func(r configcenter.RequestRecord) bool {
			return r.Caller == caller && r.Route == configcenter.RouteChanges && r.Arrived.After(throttledAt.Done)
		})
		return len(polls) > 0
	})
	// Server-side times: the hold began when the cache received the 429, after it was sent.
	if gap := polls[0].Arrived.Sub(throttledAt.Done); gap < retryAfter {
		t.Errorf("the feed polled %s after a 429 asking every caller to wait %s", gap, retryAfter)
	}
}

// TestMetricsPrefix: a cache with a metrics prefix of its own exports
// under it (its lookups and its entries), and adds nothing to the default
// prefix's series.
func TestMetricsPrefix(t *testing.T) {
	h := newHarness(t, setup{server: standin.Options{Seed: configcenter.SeedOptions{Domains: 1, KeysPerDomain: 1, ValueBytes: 8}},
		opts: func(o *externalcache.Options) { o.MetricsPrefix = "pricing" }})
	key := externalcache.Key{Domain: configcenter.SeedDomain(0), Name: configcenter.SeedKey(0)}
	h.wait(0, key)
	if l := h.cache.Get(0, key); l.State != externalcache.StateFresh {
		t.Fatalf("lookup: %+v", l)
	}
	if n := gaugeSum(t, "pricing_externalcache_entries"); n != 1 {
		t.Errorf("pricing_externalcache_entries = %v, want 1", n)
	}
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lookups float64
	for _, f := range families {
		if f.GetName() == "pricing_externalcache_requests_total" {
			for _, m := range f.GetMetric() {
				lookups += m.GetCounter().GetValue()
			}
		}
	}
	if lookups == 0 {
		t.Error("no lookup counted in pricing_externalcache_requests_total")
	}
}
