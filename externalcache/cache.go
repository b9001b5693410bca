package externalcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// State says how a Lookup may be used.
type State uint8

const (
	// StatePending: no usable value; a fetch is queued, in flight or waiting to be retried. Err
	// carries the last fetch error, if any.
	StatePending State = iota
	// StateFresh: the value is within its soft TTL.
	StateFresh
	// StateStale: the value is past its soft TTL but within its hard TTL; it is served while a
	// refresh runs. Err carries the last refresh error, if any (for example ErrCircuitOpen).
	StateStale
	// StateNotFound: the source said the key does not exist, within NegativeTTL.
	StateNotFound
)

// String names the state for logs and conditions.
func (s State) String() string {
	switch s {
	case StatePending:
		return "Pending"
	case StateFresh:
		return "Fresh"
	case StateStale:
		return "Stale"
	case StateNotFound:
		return "NotFound"
	}
	return fmt.Sprintf("State(%d)", s)
}

// Lookup is the answer of Get: a value and how it may be used, never a wait.
type Lookup struct {
	// Value is the cached value, set when State is StateFresh or StateStale. It is the caller's
	// copy.
	Value []byte
	// Revision is the source's revision of the value.
	Revision int64
	// FetchedAt is when the value (or the not-found answer) was fetched, by Options.Clock.
	FetchedAt time.Time
	State     State
	// Err is the last fetch error for the key, so a caller can report the service unavailable
	// while serving a stale value.
	Err error
	// FeedErr is set while the change feed of the key's domain is unhealthy; it wraps
	// ErrFeedUnhealthy and says why. A change of the key then reaches the cache only when the
	// value is refreshed on its soft TTL, so even a fresh value is not known to be current.
	FeedErr error
}

// Cache is a sharded, off-heap cache of an external service's keys with asynchronous,
// protected fetching. Create it with New and run it with Start; Get, Wait, Warm and DropShard are
// safe for concurrent use.
//
// It composes four parts, each with its own state and lock: the store (the values, off the Go
// heap), the fetcher (the flights of keys being fetched, their queue and workers), the guard
// (every call to the Source), and the feeds (one change-feed loop per domain in use, and the
// verdicts on their health); the notifier tells the controller what changed. The Cache itself
// keeps the held shards and answers reads by asking the parts in turn.
//
// Its life: New returns it serving reads from the store and queueing fetches; Start runs the
// workers, the notifier, the sweeper and the feeds until its context ends; then every waiter is
// released with ErrStopped, and no fetch is queued again. It starts once.
type Cache struct {
	opts    Options
	log     logr.Logger
	metrics *cacheMetrics

	// ctx is the cache's lifetime: cancelled when Start's context is done.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started atomic.Bool

	shardsMu sync.Mutex
	shards   atomic.Pointer[map[int32]*shard]

	store    *store
	guard    *guard
	fetcher  *fetcher
	feeds    *feeds
	notifier *notifier
}

// New validates the options, applies defaults and returns a Cache that serves Get at once and
// fetches once Start runs.
func New(opts Options) (*Cache, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("configuring the external cache: %w", err)
	}
	c := &Cache{opts: opts, log: opts.Logger, metrics: metricsFor(opts.MetricsPrefix)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	st, err := newStore(c.ctx, opts, c.metrics.evictions, c.log)
	if err != nil {
		c.cancel()
		return nil, err
	}
	c.store = st
	c.guard = newGuard(c.ctx, opts, c.metrics, c.log)
	c.notifier = newNotifier(opts.OnUpdate, opts.OnFeedHealth, opts.NotifyQueueSize, c.log, c.metrics.notificationsDropped)
	c.feeds = newFeeds(c.ctx, opts, &c.guard.hold, c.metrics.retryAfterCapped, c.log, c.applyChange, c.feedJudged)
	c.fetcher = newFetcher(c.ctx, opts, c.guard, c.notifier, c.feeds.err, c.metrics, c.log)
	c.shards.Store(&map[int32]*shard{})
	return c, nil
}

// NeedLeaderElection is false: every replica caches the data of the shards
// it holds, so the cache must run on every replica, not only on the leader
// (controller-runtime runs runnables without this method on the leader only).
func (c *Cache) NeedLeaderElection() bool { return false }

// Start runs the fetch workers, the notification dispatcher and the change feeds until ctx is
// done, then releases every waiter with ErrStopped. It makes the Cache a controller-runtime
// manager.Runnable. It may be called once.
func (c *Cache) Start(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("starting the external cache: already started")
	}
	c.metrics.addLive(c)
	defer c.metrics.removeLive(c)
	stop := context.AfterFunc(ctx, c.cancel)
	defer stop()

	c.log.Info("Starting external cache", "workers", c.opts.Workers, "maxBytes", c.opts.MaxBytes,
		"maxShards", c.opts.MaxShards, "feed", c.opts.Feed != nil)
	for range c.opts.Workers {
		c.wg.Go(c.fetcher.work)
	}
	c.wg.Go(func() { c.notifier.run(c.ctx) })
	c.wg.Go(func() { c.fetcher.retryOnRecovery(c.ctx) })
	c.wg.Go(func() { c.store.sweeper(c.ctx) })
	c.feeds.start()

	<-c.ctx.Done()
	c.feeds.stop()
	c.wg.Wait()
	c.fetcher.stop()
	c.log.Info("Stopped external cache")
	return nil
}

// Get returns what the cache knows about key in shard without ever waiting: a fresh value; a
// stale one, with a refresh enqueued; a cached not-found; or Pending, with a fetch enqueued.
// The controller is told through OnUpdate when a pending key resolves or a value changes.
func (c *Cache) Get(shard int32, key Key) Lookup {
	sh, err := c.shardForKey(shard, key)
	if err != nil {
		c.metrics.miss.Inc()
		return Lookup{Err: fmt.Errorf("getting %s: %w", key, err)}
	}
	ck := key.cacheKey()
	if l, ok := sh.fresh(key, ck, c.opts.Clock.Now()); ok {
		// Served; while its domain's feed is unhealthy, it is refreshed at its soft expiry.
		if l.FeedErr = c.feeds.err(key.Domain); l.FeedErr != nil {
			c.fetcher.arm(sh, key, ck)
		}
		c.countLookup(l)
		return l
	}
	l, full := c.admit(sh, key, ck)
	l.FeedErr = c.feeds.err(key.Domain)
	if full {
		c.metrics.queueRejected.Inc()
		l.Err = fmt.Errorf("fetching %s: %w", key, ErrQueueFull)
	}
	// Pending without an error of its own: say why it may take a while.
	if l.Err == nil && l.State == StatePending {
		l.Err = c.guard.hold.err()
	}
	if l.Err == nil && l.State == StatePending {
		l.Err = c.store.evictedErr(sh.storeKey(ck), key)
	}
	c.countLookup(l)
	return l
}

// admit uses key's domain in sh and admits the read: again if ReleaseDomain released the domain
// between the two, so that no flight is left for a domain the shard no longer uses.
func (c *Cache) admit(sh *shard, key Key, ck string) (Lookup, bool) {
	for {
		c.useDomain(sh, key.Domain)
		l, full := c.fetcher.admit(sh, key, ck)
		if !errors.Is(l.Err, errDomainReleased) {
			return l, full
		}
	}
}

// shardForKey is the held shard that key is read in, once key is valid.
func (c *Cache) shardForKey(id int32, key Key) (*shard, error) {
	if err := key.validate(); err != nil {
		return nil, err
	}
	return c.shardFor(id)
}

func (c *Cache) countLookup(l Lookup) {
	switch l.State {
	case StateFresh:
		c.metrics.hit.Inc()
	case StateStale:
		c.metrics.stale.Inc()
	case StateNotFound:
		c.metrics.negative.Inc()
	default:
		c.metrics.miss.Inc()
	}
}

// Wait blocks until key is resolved or ctx is done, for callers that may block (admission
// webhooks, tools, tests): it returns at once for a fresh, stale or not-found key, and otherwise
// waits for the key's fetch on the same path that notifies OnUpdate. A failed fetch returns its
// error with the Lookup (Stale with the old value, or Pending). A not-found key is not an error.
func (c *Cache) Wait(ctx context.Context, shard int32, key Key) (Lookup, error) {
	sh, err := c.shardForKey(shard, key)
	if err != nil {
		return Lookup{Err: err}, fmt.Errorf("waiting for %s: %w", key, err)
	}
	ck := key.cacheKey()
	c.useDomain(sh, key.Domain)
	for {
		l, res, room := c.fetcher.await(sh, key, ck)
		switch {
		case errors.Is(l.Err, errDomainReleased):
			// Released between useDomain and the admission: use it again.
			c.useDomain(sh, key.Domain)
			continue
		case room != nil:
			select {
			case <-room:
				continue
			case <-sh.ctx.Done():
				// Dropped (or stopped): the next admission says which.
				continue
			case <-ctx.Done():
				return l, fmt.Errorf("waiting for %s: %w", key, ctx.Err())
			}
		case res == nil:
			l.FeedErr = c.feeds.err(key.Domain)
			return l, waitErr(l)
		}
		select {
		case <-res.done:
			if errors.Is(res.lookup.Err, errDomainReleased) {
				// Released under the wait: reading the key uses the domain again.
				c.useDomain(sh, key.Domain)
				continue
			}
			l = res.lookup
			l.Value = bytes.Clone(l.Value)
			l.FeedErr = c.feeds.err(key.Domain)
			return l, waitErr(l)
		case <-ctx.Done():
			return l, fmt.Errorf("waiting for %s: %w", key, ctx.Err())
		}
	}
}

func waitErr(l Lookup) error {
	if l.State == StatePending {
		if l.Err == nil {
			return errors.New("fetch ended without a result")
		}
		return l.Err
	}
	return nil
}

// Warm enqueues fetches for the keys of shard that are not fresh, waiting for room in the queue
// when it is full. A controller calls it in the background after acquiring a shard, so that its
// objects find their keys cached. It runs within the shard's tenure: it returns ErrShardDropped as
// soon as DropShard drops the shard, and enqueues nothing for a dropped shard, even when ctx
// outlives the tenure.
func (c *Cache) Warm(ctx context.Context, shard int32, keys ...Key) error {
	sh, err := c.shardFor(shard)
	if err != nil {
		return fmt.Errorf("warming shard %d: %w", shard, err)
	}
	var errs []error
	for _, key := range keys {
		if err := key.validate(); err != nil {
			errs = append(errs, fmt.Errorf("warming %s: %w", key, err))
			continue
		}
		ck := key.cacheKey()
		if _, ok := sh.fresh(key, ck, c.opts.Clock.Now()); ok {
			continue
		}
		c.useDomain(sh, key.Domain)
		for {
			l, room := c.fetcher.enqueue(sh, key, ck)
			if errors.Is(l.Err, errDomainReleased) {
				// Released between useDomain and the admission: use it again.
				c.useDomain(sh, key.Domain)
				continue
			}
			if room == nil {
				if errors.Is(l.Err, ErrShardDropped) || errors.Is(l.Err, ErrStopped) {
					return fmt.Errorf("warming shard %d: %w", shard, l.Err)
				}
				break
			}
			select {
			case <-room:
			case <-sh.ctx.Done():
				// Dropped (or stopped): the next admission says which.
			case <-ctx.Done():
				return fmt.Errorf("warming shard %d: %w", shard, ctx.Err())
			}
		}
	}
	return errors.Join(errs...)
}

// Fetch reads one key from the source now, through the guards of the cache's own fetches: the
// Retry-After hold, the rate limit, the circuit breaker, and the single flight it shares with
// the held shards' fetches of the key. It caches nothing. It is for a reader that keeps values
// elsewhere (the mirror, reconcile/externaldomain), which would otherwise call the source around
// the guards that protect it. A key that does not exist fails with an error wrapping
// ErrNotFound; a call the guards stopped, with one wrapping ErrCircuitOpen, or ErrRetryAfterHold
// with the wait left as its RetryAfterHint.
func (c *Cache) Fetch(ctx context.Context, key Key) (Value, error) {
	if err := key.validate(); err != nil {
		return Value{}, fmt.Errorf("fetching %s: %w", key, err)
	}
	return c.guard.fetch(ctx, key)
}

// KeyExists answers from the change feed alone whether a key exists: known is false unless a
// feed of the key's domain runs (a held shard uses the domain), has listed the domain and is
// healthy (an unhealthy feed's list may lack keys or keep deleted ones). It never calls the
// service, so an admission check can use it on the request path.
func (c *Cache) KeyExists(key Key) (exists, known bool) { return c.feeds.keyExists(key) }

// FeedDomains lists the domains whose change feed is subscribed, sorted.
func (c *Cache) FeedDomains() []string { return c.feeds.domains() }

// applyChange applies a change the feed of domain reported to every held shard that uses the
// domain: it refreshes the key where another revision of it is cached, and tells OnUpdate where
// nothing servable is. A cached revision higher than the change's is wrong too: the source
// restarted and lost it (or, rarely, a fetch raced ahead of the feed, and the refresh costs one
// call).
func (c *Cache) applyChange(domain string, ch Change) {
	key := Key{Domain: domain, Name: ch.Name}
	if key.validate() != nil {
		return
	}
	ck := key.cacheKey()
	now := c.opts.Clock.Now()
	for _, sh := range *c.shards.Load() {
		if sh.usesDomain(domain) {
			c.fetcher.changed(sh, key, ck, ch, now)
		}
	}
}

// feedJudged acts on a new verdict on domain's feed: every held shard that uses the domain is
// told (OnFeedHealth), and a healed feed's fallback refreshes stop.
func (c *Cache) feedJudged(domain string, healed bool) {
	if healed {
		c.fetcher.feedHealed(domain)
	}
	for _, sh := range *c.shards.Load() {
		if sh.usesDomain(domain) {
			c.notifier.addDomain(sh.id, domain)
		}
	}
}

// Stats is a point-in-time summary of a Cache, for status commands and tests.
type Stats struct {
	// Shards is the number of held shards.
	Shards int
	// Entries is the number of entries, fresh, stale, expired or negative, in all shards
	// (and, until the sweeper deleted them, of shards just dropped).
	Entries int
	// Bytes is what bigcache allocated for entries; it is bounded by MaxBytes.
	Bytes int
	// QueueDepth is the number of fetches waiting for a worker.
	QueueDepth int
	// Flights counts keys being fetched, waiting for a retry or failed.
	Flights int
	// FeedLoops counts running change-feed loops.
	FeedLoops int
	// UnhealthyFeeds counts the domains whose change feed is unhealthy (see FeedHealthOptions).
	UnhealthyFeeds int
	// Breaker is the circuit breaker's state: closed, half-open or open.
	Breaker string
}

// Stats summarises the cache.
func (c *Cache) Stats() Stats {
	s := Stats{Breaker: c.guard.breaker.State().String(), FeedLoops: int(c.feeds.loops.Load()),
		Shards: len(*c.shards.Load()), Entries: c.store.entries(), Bytes: c.store.bytes(), UnhealthyFeeds: len(*c.feeds.troubled.Load())}
	s.QueueDepth, s.Flights = c.fetcher.counts()
	return s
}
