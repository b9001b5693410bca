package externalcache

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// shard is one tenure of a held kshard shard: its entries in the cache's store (under its own
// prefix, so that a later tenure never reads them), its context, and the domains it has asked
// for, which keep their change feeds alive.
type shard struct {
	id     int32
	tenure uint64
	// prefix is the tenure, 8 bytes big endian, before every key of the shard in the store.
	prefix string
	store  *store
	ctx    context.Context
	cancel context.CancelFunc

	// mu orders useDomain against DropShard's reading of domains and ReleaseDomain.
	mu sync.RWMutex
	// dropped is set by DropShard before it removes the shard's fetches; read under fetcher.mu
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
	tenure, prefix := c.store.nextTenure()
	sh := &shard{id: id, tenure: tenure, prefix: prefix, store: c.store}
	sh.ctx, sh.cancel = context.WithCancel(c.ctx)
	next := maps.Clone(held)
	next[id] = sh
	c.shards.Store(&next)
	c.log.V(1).Info("Holding shard in the external cache", "shard", id, "tenure", tenure)
	return nil
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

	// From here on no admission creates a fetch for the shard (the fetcher checks dropped under
	// its lock, which dropShard takes after this), so dropShard removes every fetch it will ever
	// have.
	sh.mu.Lock()
	sh.dropped.Store(true)
	sh.mu.Unlock()
	sh.cancel()
	discarded := c.fetcher.dropShard(sh)

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
		c.feeds.release(d)
	}
	// Its entries can no longer be read (a later tenure has another prefix); the sweeper frees
	// their room in the background, so that dropping stays O(1) on the handover path.
	c.store.forget(sh.prefix)
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
	// Under sh.mu: a useDomain that stored the domain has subscribed its feed before this takes
	// it, so subscriptions and releases stay paired.
	sh.mu.Lock()
	_, used := sh.domains.LoadAndDelete(domain)
	sh.mu.Unlock()
	if !used {
		return
	}
	discarded := c.fetcher.releaseDomain(sh, domain)
	c.feeds.release(domain)
	c.store.forget(sh.domainPrefix(domain))
	c.log.V(1).Info("Released domain in the external cache", "shard", shard, "tenure", sh.tenure, "domain", domain,
		"discardedFetches", discarded)
}

// useDomain records that sh uses domain, subscribing the domain's change feed the first time.
func (c *Cache) useDomain(sh *shard, domain string) {
	if sh.usesDomain(domain) {
		return
	}
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if sh.dropped.Load() {
		return
	}
	if _, loaded := sh.domains.LoadOrStore(domain, struct{}{}); !loaded {
		// Used again after a release: a sweep not yet begun must not delete its new entries.
		c.store.keep(sh.domainPrefix(domain))
		c.feeds.acquire(domain)
	}
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

// Shards lists the held shards, sorted.
func (c *Cache) Shards() []int32 {
	return slices.Sorted(maps.Keys(*c.shards.Load()))
}

// shardFor returns a held shard.
func (c *Cache) shardFor(id int32) (*shard, error) {
	if sh := (*c.shards.Load())[id]; sh != nil {
		return sh, nil
	}
	return nil, fmt.Errorf("shard %d: %w", id, ErrShardNotHeld)
}

// domainPrefix is the prefix of the store keys of domain in the shard's tenure.
func (s *shard) domainPrefix(domain string) string { return s.prefix + domain + "\x00" }

// storeKey is the key of ck in the store.
func (s *shard) storeKey(ck string) string { return s.prefix + ck }

func (s *shard) set(ck string, b []byte) error { return s.store.set(s.storeKey(ck), b) }

func (s *shard) envelope(ck string) (envelope, bool) { return s.store.get(s.storeKey(ck)) }

// expire makes the shard's entry of ck stale at now (store.expire).
func (s *shard) expire(ck string, now time.Time) { s.store.expire(s.storeKey(ck), now) }

func (s *shard) lookup(ck string, now time.Time) (Lookup, bool) {
	e, ok := s.envelope(ck)
	if !ok {
		return Lookup{}, false
	}
	return e.lookup(now)
}

// fresh answers a read from the store alone: a fresh value or a cached not-found of a domain the
// shard uses. An entry of a domain the shard does not use (released, and not yet swept) is not
// trusted: the read notes the domain, whose change feed then checks it.
func (s *shard) fresh(key Key, ck string, now time.Time) (Lookup, bool) {
	l, ok := s.lookup(ck, now)
	if ok && (l.State == StateFresh || l.State == StateNotFound) && s.usesDomain(key.Domain) {
		return l, true
	}
	return Lookup{}, false
}

func (s *shard) usesDomain(domain string) bool {
	_, ok := s.domains.Load(domain)
	return ok
}
