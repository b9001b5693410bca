package externalcache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allegro/bigcache/v3"
	"github.com/go-logr/logr"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
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
type Cache struct {
	opts Options
	log  logr.Logger
	// bc holds the entries of every held shard, each key prefixed with its shard's tenure, so
	// that the shards held share MaxBytes however many they are.
	bc *bigcache.BigCache
	// tenures numbers the shards' tenures: AddShard takes the next.
	tenures atomic.Uint64
	// evictions remembers the entries evicted for room while servable, so that their refill is
	// told from a change and their Lookups say why they are missing.
	evictions evictions
	// metrics are the metrics of the caches of this cache's prefix.
	metrics *cacheMetrics
	// sweep asks the sweeper to delete the entries of dropped tenures.
	sweep  chan struct{}
	deadMu sync.Mutex
	dead   map[string]struct{} // tenure prefixes whose entries are to be deleted

	// ctx is the cache's lifetime: cancelled when Start's context is done.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	shardsMu sync.Mutex
	shards   atomic.Pointer[map[int32]*shard]

	// mu guards the fetch state: flights, the ready queue and waiting for queue room.
	mu      sync.Mutex
	flights map[flightKey]*flight
	ready   []*flight
	space   chan struct{}
	wake    chan struct{}

	feedsMu   sync.Mutex
	feeds     map[string]*subscription
	running   bool
	feedLoops atomic.Int32
	// troubled holds the domains whose feed is unhealthy, replaced whole under feedsMu, so that
	// Get reads it without a lock.
	troubled atomic.Pointer[map[string]feedTrouble]
	// ttl refreshes keys of troubled domains on their soft TTL. Guarded by mu.
	ttl map[flightKey]*ttlTimer

	group   singleflight.Group
	limiter *rate.Limiter
	breaker *gobreaker.CircuitBreaker[Value]
	// halfOpens counts the breaker's transitions to half-open, each of which lets
	// HalfOpenProbes calls through.
	halfOpens atomic.Int64
	hold      hold
	notifier  *notifier
	started   atomic.Bool
}

// New validates the options, applies defaults and returns a Cache that serves Get at once and
// fetches once Start runs.
func New(opts Options) (*Cache, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("configuring the external cache: %w", err)
	}
	c := &Cache{
		opts:    opts,
		log:     opts.Logger,
		flights: map[flightKey]*flight{},
		ttl:     map[flightKey]*ttlTimer{},
		wake:    make(chan struct{}, opts.Workers),
		feeds:   map[string]*subscription{},
		limiter: rate.NewLimiter(opts.RateLimit, opts.RateBurst),
		sweep:   make(chan struct{}, 1),
		dead:    map[string]struct{}{},
	}
	c.metrics = metricsFor(opts.MetricsPrefix)
	c.evictions.init(opts.Clock.Now, c.metrics.evictions)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	bc, err := bigcache.New(c.ctx, opts.bigcacheConfig(c.evictions.record))
	if err != nil {
		c.cancel()
		return nil, fmt.Errorf("creating the external cache's store: %w", err)
	}
	c.bc = bc
	c.breaker = newBreaker(opts.Breaker, func() context.Context { return c.ctx }, c.log, &c.halfOpens)
	c.notifier = newNotifier(opts.OnUpdate, opts.OnFeedHealth, opts.NotifyQueueSize, c.log, c.metrics.notificationsDropped)
	c.shards.Store(&map[int32]*shard{})
	c.troubled.Store(&map[string]feedTrouble{})
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
		c.wg.Go(c.work)
	}
	c.wg.Go(func() { c.notifier.run(c.ctx) })
	c.wg.Go(c.sweeper)
	c.feedsMu.Lock()
	c.running = true
	for domain, sub := range c.feeds {
		c.startFeedLocked(domain, sub)
	}
	c.feedsMu.Unlock()

	<-c.ctx.Done()
	c.feedsMu.Lock()
	c.running = false
	c.feedsMu.Unlock()
	c.wg.Wait()
	c.mu.Lock()
	for fk, f := range c.flights {
		delete(c.flights, fk)
		c.releaseLocked(f, Lookup{Err: fmt.Errorf("fetching %s: %w", f.key, ErrStopped)})
	}
	c.ready = nil
	c.disarmLocked(func(flightKey, *ttlTimer) bool { return true })
	c.mu.Unlock()
	c.log.Info("Stopped external cache")
	return nil
}

// Get returns what the cache knows about key in shard without ever waiting: a fresh value; a
// stale one, with a refresh enqueued; a cached not-found; or Pending, with a fetch enqueued.
// The controller is told through OnUpdate when a pending key resolves or a value changes.
func (c *Cache) Get(shard int32, key Key) Lookup {
	if err := key.validate(); err != nil {
		c.metrics.miss.Inc()
		return Lookup{Err: fmt.Errorf("getting %s: %w", key, err)}
	}
	sh, err := c.shardFor(shard)
	if err != nil {
		c.metrics.miss.Inc()
		return Lookup{Err: fmt.Errorf("getting %s: %w", key, err)}
	}
	ck := key.cacheKey()
	// An entry of a domain the shard does not use (released, and not yet swept) is not trusted:
	// the read notes the domain, whose change feed then checks it.
	if l, ok := sh.lookup(ck, c.opts.Clock.Now()); ok && (l.State == StateFresh || l.State == StateNotFound) && sh.usesDomain(key.Domain) {
		if l.FeedErr = c.feedErr(key.Domain); l.FeedErr != nil {
			c.mu.Lock()
			c.armLocked(sh, key, ck)
			c.mu.Unlock()
		}
		c.countLookup(l)
		return l
	}
	sh.noteDomain(c, key.Domain)
	c.mu.Lock()
	l, _, full := c.admitLocked(sh, key, ck)
	c.mu.Unlock()
	l.FeedErr = c.feedErr(key.Domain)
	if full {
		c.metrics.queueRejected.Inc()
		l.Err = fmt.Errorf("fetching %s: %w", key, ErrQueueFull)
	}
	if l.Err == nil && l.State == StatePending {
		l.Err = c.hold.err()
	}
	if l.Err == nil && l.State == StatePending {
		l.Err = c.evictedErr(sh, key, ck)
	}
	c.countLookup(l)
	return l
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
	if err := key.validate(); err != nil {
		return Lookup{Err: err}, fmt.Errorf("waiting for %s: %w", key, err)
	}
	sh, err := c.shardFor(shard)
	if err != nil {
		return Lookup{Err: err}, fmt.Errorf("waiting for %s: %w", key, err)
	}
	ck := key.cacheKey()
	sh.noteDomain(c, key.Domain)
	for {
		c.mu.Lock()
		l, f, full := c.admitLocked(sh, key, ck)
		if full {
			room := c.roomLocked()
			c.mu.Unlock()
			select {
			case <-room:
				continue
			case <-sh.ctx.Done():
				// Dropped (or stopped): the next admission says which.
				continue
			case <-ctx.Done():
				return l, fmt.Errorf("waiting for %s: %w", key, ctx.Err())
			}
		}
		if l.State != StatePending || f == nil || f.state == stateFailed {
			c.armLocked(sh, key, ck)
			c.mu.Unlock()
			l.FeedErr = c.feedErr(key.Domain)
			return l, waitErr(l)
		}
		r := f.resolution()
		c.mu.Unlock()
		select {
		case <-r.done:
			if errors.Is(r.lookup.Err, errDomainReleased) {
				// Released under the wait: reading the key uses the domain again.
				sh.noteDomain(c, key.Domain)
				continue
			}
			l = r.lookup
			l.Value = bytes.Clone(l.Value)
			l.FeedErr = c.feedErr(key.Domain)
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
		if l, ok := sh.lookup(ck, c.opts.Clock.Now()); ok && (l.State == StateFresh || l.State == StateNotFound) && sh.usesDomain(key.Domain) {
			continue
		}
		sh.noteDomain(c, key.Domain)
		for {
			c.mu.Lock()
			l, _, full := c.admitLocked(sh, key, ck)
			if !full {
				c.mu.Unlock()
				if errors.Is(l.Err, ErrShardDropped) || errors.Is(l.Err, ErrStopped) {
					return fmt.Errorf("warming shard %d: %w", shard, l.Err)
				}
				break
			}
			room := c.roomLocked()
			c.mu.Unlock()
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

// DropShard forgets everything about shard: its entries, its queued and in-flight fetches
// (waiters get ErrShardDropped, results are discarded) and its share of the change feeds, which
// stop for domains no other held shard uses. A controller calls it when it releases the shard,
// after the shard's reconciles have stopped; the shard is held again only by AddShard.
func (c *Cache) DropShard(shard int32) {
	c.shardsMu.Lock()
	held := *c.shards.Load()
	sh := held[shard]
	if sh == nil {
		c.shardsMu.Unlock()
		return
	}
	next := maps.Clone(held)
	delete(next, shard)
	c.shards.Store(&next)
	c.shardsMu.Unlock()

	// From here on no admission creates a fetch for the shard (admitLocked and refreshLocked
	// check dropped under c.mu, which the loop below takes after this), so the loop removes
	// every fetch it will ever have.
	sh.mu.Lock()
	sh.dropped.Store(true)
	sh.mu.Unlock()
	sh.cancel()

	c.mu.Lock()
	discarded := 0
	for fk, f := range c.flights {
		if f.sh == sh {
			delete(c.flights, fk)
			c.releaseLocked(f, Lookup{Err: fmt.Errorf("fetching %s: %w", f.key, ErrShardDropped)})
			discarded++
		}
	}
	c.ready = slices.DeleteFunc(c.ready, func(f *flight) bool { return f.sh == sh })
	c.disarmLocked(func(_ flightKey, tt *ttlTimer) bool { return tt.sh == sh })
	c.roomMadeLocked()
	c.mu.Unlock()

	var domains []string
	sh.domains.Range(func(d, _ any) bool {
		// LoadAndDelete: a ReleaseDomain racing with the drop releases a domain it takes, and
		// the drop the others, so that each is released once.
		if _, ok := sh.domains.LoadAndDelete(d); ok {
			domains = append(domains, d.(string))
		}
		return true
	})
	for _, d := range domains {
		c.releaseDomain(d)
	}
	// Its entries can no longer be read (a later tenure has another prefix); the sweeper frees
	// their room in the background, so that dropping stays O(1) on the handover path.
	c.deadMu.Lock()
	c.dead[sh.prefix] = struct{}{}
	c.deadMu.Unlock()
	select {
	case c.sweep <- struct{}{}:
	default:
	}
	c.log.Info("Dropped shard from the external cache", "shard", shard, "tenure", sh.tenure,
		"discardedFetches", discarded, "domains", len(domains))
}

// ReleaseDomain forgets domain in shard: the shard no longer uses it, so the domain's change
// feed stops unless another held shard uses it, the shard's queued and in-flight fetches and TTL
// refreshes of the domain end (a Wait on one reads the key again), and the sweeper deletes the
// shard's entries of the domain. A controller calls it when the last object of the shard that
// reads the domain is gone, so that what the cache keeps per domain (a long poll to the source,
// above all) follows the domains in use rather than every domain the shard ever read. A later
// read of the domain in the shard starts afresh: it notes the domain, whose feed lists it again
// and checks any entry not yet swept. Releasing a domain the shard does not use, or in a shard not
// held, does nothing.
func (c *Cache) ReleaseDomain(shard int32, domain string) {
	sh := (*c.shards.Load())[shard]
	if sh == nil {
		return
	}
	// Under sh.mu: a noteDomain that stored the domain has subscribed its feed before this takes
	// it, so subscriptions and releases stay paired.
	sh.mu.Lock()
	_, used := sh.domains.LoadAndDelete(domain)
	sh.mu.Unlock()
	if !used {
		return
	}
	c.mu.Lock()
	discarded := 0
	for fk, f := range c.flights {
		if f.sh == sh && fk.key.Domain == domain {
			delete(c.flights, fk)
			c.releaseLocked(f, Lookup{Err: fmt.Errorf("fetching %s: %w", f.key, errDomainReleased)})
			discarded++
		}
	}
	if discarded > 0 {
		c.ready = slices.DeleteFunc(c.ready, func(f *flight) bool { return f.sh == sh && f.key.Domain == domain })
		c.roomMadeLocked()
	}
	c.disarmLocked(func(fk flightKey, tt *ttlTimer) bool { return tt.sh == sh && fk.key.Domain == domain })
	c.mu.Unlock()
	c.releaseDomain(domain)
	c.deadMu.Lock()
	c.dead[sh.domainPrefix(domain)] = struct{}{}
	c.deadMu.Unlock()
	select {
	case c.sweep <- struct{}{}:
	default:
	}
	c.log.V(1).Info("Released domain in the external cache", "shard", shard, "tenure", sh.tenure, "domain", domain,
		"discardedFetches", discarded)
}

// Domains lists the domains shard uses, sorted: those read since the shard was added or since
// the domain was released. They are what the cache keeps per domain for the shard, and what a
// controller checks for objects left when one of the shard's objects goes (ReleaseDomain).
func (c *Cache) Domains(shard int32) []string {
	sh := (*c.shards.Load())[shard]
	if sh == nil {
		return nil
	}
	var out []string
	sh.domains.Range(func(d, _ any) bool {
		out = append(out, d.(string))
		return true
	})
	slices.Sort(out)
	return out
}

// usedDomains counts the distinct domains the held shards use.
func (c *Cache) usedDomains() int {
	seen := map[string]struct{}{}
	for _, sh := range *c.shards.Load() {
		sh.domains.Range(func(d, _ any) bool {
			seen[d.(string)] = struct{}{}
			return true
		})
	}
	return len(seen)
}

// sweeper deletes the entries of dropped tenures and released domains, one pass over the store
// per batch of them.
func (c *Cache) sweeper() {
	for {
		select {
		case <-c.sweep:
		case <-c.ctx.Done():
			return
		}
		c.deadMu.Lock()
		dead := c.dead
		c.dead = map[string]struct{}{}
		c.deadMu.Unlock()
		if len(dead) == 0 {
			continue
		}
		removed := 0
		for it := c.bc.Iterator(); it.SetNext() && c.ctx.Err() == nil; {
			e, err := it.Value()
			if err != nil {
				continue
			}
			if isDead(dead, e.Key()) && c.bc.Delete(e.Key()) == nil {
				removed++
			}
		}
		c.evictions.forget(dead)
		c.log.V(1).Info("Deleted the entries of dropped shards and released domains", "prefixes", len(dead), "entries", removed)
	}
}

// Shards lists the held shards, sorted.
func (c *Cache) Shards() []int32 {
	return slices.Sorted(maps.Keys(*c.shards.Load()))
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
	s := Stats{Breaker: c.breaker.State().String(), FeedLoops: int(c.feedLoops.Load()),
		Shards: len(*c.shards.Load()), Entries: c.bc.Len(), Bytes: c.bc.Capacity(), UnhealthyFeeds: len(*c.troubled.Load())}
	c.mu.Lock()
	s.QueueDepth = len(c.ready)
	s.Flights = len(c.flights)
	c.mu.Unlock()
	return s
}

// FeedDomains lists the domains whose change feed is subscribed, sorted.
func (c *Cache) FeedDomains() []string {
	c.feedsMu.Lock()
	defer c.feedsMu.Unlock()
	return slices.Sorted(maps.Keys(c.feeds))
}

func (c *Cache) queueDepth() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ready)
}

// shard is one tenure of a held kshard shard: its entries in the cache's store (under its own
// prefix, so that a later tenure never reads them), its context, and the domains it has asked
// for, which keep their change feeds alive.
type shard struct {
	id     int32
	tenure uint64
	// prefix is the tenure, 8 bytes big endian, before every key of the shard in the store.
	prefix string
	bc     *bigcache.BigCache
	ctx    context.Context
	cancel context.CancelFunc

	// mu orders noteDomain against DropShard's reading of domains and ReleaseDomain.
	mu sync.RWMutex
	// dropped is set by DropShard before it removes the shard's fetches; read under Cache.mu
	// it means no fetch may be created for the shard any more.
	dropped atomic.Bool
	domains sync.Map // string → struct{}
}

// AddShard makes the cache hold shard id: a new tenure (its entries' key prefix in the shared
// store), its fetches and its share of the change feeds. A controller calls it when it starts a
// shard, before the shard's first Get, and DropShard when the shard ends; adding a held shard
// again does nothing. Get, Wait and Warm for a shard not added report ErrShardNotHeld, so a
// warm-up racing a release never brings a dropped shard back (with feed loops nobody would
// stop).
func (c *Cache) AddShard(id int32) error {
	if id < 0 {
		return fmt.Errorf("adding shard %d: shard is negative", id)
	}
	c.shardsMu.Lock()
	defer c.shardsMu.Unlock()
	held := *c.shards.Load()
	if held[id] != nil {
		return nil
	}
	if len(held) >= c.opts.MaxShards {
		return fmt.Errorf("adding shard %d: %w: %d are held, MaxShards is %d", id, ErrTooManyShards, len(held), c.opts.MaxShards)
	}
	tenure := c.tenures.Add(1)
	sh := &shard{id: id, tenure: tenure, prefix: string(binary.BigEndian.AppendUint64(nil, tenure)), bc: c.bc}
	sh.ctx, sh.cancel = context.WithCancel(c.ctx)
	next := maps.Clone(held)
	next[id] = sh
	c.shards.Store(&next)
	c.log.V(1).Info("Holding shard in the external cache", "shard", id, "tenure", tenure)
	return nil
}

// shardFor returns a held shard.
func (c *Cache) shardFor(id int32) (*shard, error) {
	if sh := (*c.shards.Load())[id]; sh != nil {
		return sh, nil
	}
	return nil, fmt.Errorf("shard %d: %w", id, ErrShardNotHeld)
}

// tenurePrefixLen is the length of a shard's prefix in the store's keys.
const tenurePrefixLen = 8

// domainPrefix is the prefix of the store keys of domain in the shard's tenure.
func (s *shard) domainPrefix(domain string) string { return s.prefix + domain + "\x00" }

// isDead reports whether a store key is of a dropped tenure or of a released domain of a tenure:
// dead holds tenure prefixes and domain prefixes (domainPrefix).
func isDead(dead map[string]struct{}, storeKey string) bool {
	if len(storeKey) < tenurePrefixLen {
		return false
	}
	if _, ok := dead[storeKey[:tenurePrefixLen]]; ok {
		return true
	}
	i := strings.IndexByte(storeKey[tenurePrefixLen:], 0)
	if i < 0 {
		return false
	}
	_, ok := dead[storeKey[:tenurePrefixLen+i+1]]
	return ok
}

// storeKey is the key of ck in the store.
func (s *shard) storeKey(ck string) string { return s.prefix + ck }

func (s *shard) set(ck string, b []byte) error { return s.bc.Set(s.storeKey(ck), b) }

func (s *shard) delete(ck string) { _ = s.bc.Delete(s.storeKey(ck)) }

func (s *shard) envelope(ck string) (envelope, bool) {
	b, err := s.bc.Get(s.storeKey(ck))
	if err != nil {
		return envelope{}, false
	}
	e, err := decodeEnvelope(b)
	if err != nil {
		return envelope{}, false
	}
	return e, true
}

func (s *shard) lookup(ck string, now time.Time) (Lookup, bool) {
	e, ok := s.envelope(ck)
	if !ok {
		return Lookup{}, false
	}
	return e.lookup(now)
}

// noteDomain records that the shard uses domain, subscribing the domain's change feed the first
// time.
func (s *shard) noteDomain(c *Cache, domain string) {
	if _, ok := s.domains.Load(domain); ok {
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.dropped.Load() {
		return
	}
	if _, loaded := s.domains.LoadOrStore(domain, struct{}{}); !loaded {
		// Used again after a release: a sweep not yet begun must not delete its new entries.
		c.deadMu.Lock()
		delete(c.dead, s.domainPrefix(domain))
		c.deadMu.Unlock()
		c.acquireDomain(domain)
	}
}

func (s *shard) usesDomain(domain string) bool {
	_, ok := s.domains.Load(domain)
	return ok
}
