package externalcache

import (
	"context"
)

// subscription is the cache's change-feed subscription of one domain, shared by every held shard
// that uses the domain: one FeedLoop per domain per replica, whatever the number of keys.
type subscription struct {
	refs   int
	cancel context.CancelFunc
	// names are the domain's existing keys as the feed last listed them, once synced: what
	// an admission check can answer without calling the service. Guarded by Cache.feedsMu.
	names  map[string]struct{}
	synced bool
}

// acquireDomain counts one more shard using domain and starts its feed on the first.
func (c *Cache) acquireDomain(domain string) {
	if c.opts.Feed == nil {
		return
	}
	c.feedsMu.Lock()
	defer c.feedsMu.Unlock()
	sub := c.feeds[domain]
	if sub == nil {
		sub = &subscription{}
		c.feeds[domain] = sub
	}
	sub.refs++
	if c.running {
		c.startFeedLocked(domain, sub)
	}
}

// releaseDomain counts one shard less using domain and stops its feed on the last.
func (c *Cache) releaseDomain(domain string) {
	c.feedsMu.Lock()
	defer c.feedsMu.Unlock()
	sub := c.feeds[domain]
	if sub == nil {
		return
	}
	if sub.refs--; sub.refs > 0 {
		return
	}
	delete(c.feeds, domain)
	c.forgetTroubleLocked(domain)
	if sub.cancel != nil {
		sub.cancel()
	}
}

func (c *Cache) startFeedLocked(domain string, sub *subscription) {
	if sub.cancel != nil || sub.refs == 0 {
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	sub.cancel = cancel
	c.wg.Go(func() { c.follow(ctx, domain, sub) })
}

// follow runs the domain's FeedLoop until ctx is done, through the cache's Retry-After hold: its
// answers refresh the keys the held shards cache and tell OnUpdate of the others, and its
// verdicts on the feed's health are judged after every poll.
func (c *Cache) follow(ctx context.Context, domain string, sub *subscription) {
	c.feedLoops.Add(1)
	defer c.feedLoops.Add(-1)
	log := c.log.WithValues("domain", domain)
	l, err := NewFeedLoop(FeedLoopOptions{Feed: c.opts.Feed, Domain: domain, Retry: c.opts.FeedRetry,
		MaxRetryAfter: c.opts.MaxRetryAfter, Health: c.opts.FeedHealth, Logger: log, hold: &c.hold, capped: c.metrics.retryAfterCapped})
	if err != nil {
		log.Error(err, "Change feed not followed")
		return
	}
	log.V(1).Info("Change feed started")
	defer log.V(1).Info("Change feed stopped")
	l.Run(ctx, feedConsumer{c: c, domain: domain, sub: sub, loop: l})
}

// feedConsumer takes a domain's change feed into the cache.
type feedConsumer struct {
	c      *Cache
	domain string
	sub    *subscription
	loop   *FeedLoop
}

// Apply refreshes the keys an answer changed, and records the domain's key names. It never
// fails: a key whose refresh fails is retried by the fetch path.
func (f feedConsumer) Apply(_ context.Context, a FeedAnswer) error {
	for _, ch := range a.Changes {
		f.c.applyChange(f.domain, ch)
	}
	f.c.recordNames(f.sub, a)
	return nil
}

// Polled judges the feed's health. A flap forgets the key names, which the listing after it
// brings again.
func (f feedConsumer) Polled(_ context.Context, p FeedPoll) error {
	if p.Flapped {
		f.c.feedsMu.Lock()
		f.sub.names, f.sub.synced = nil, false
		f.c.feedsMu.Unlock()
	}
	f.c.judgeFeed(f.domain, f.sub, f.loop.health)
	return nil
}

// applyChange refreshes the key in every held shard that caches another revision of it, and
// tells OnUpdate about it in every shard that caches nothing servable for it. A cached revision
// higher than the change's is wrong too: the source restarted and lost it (or, rarely, a fetch
// raced ahead of the feed, and the refresh costs one call).
func (c *Cache) applyChange(domain string, ch Change) {
	key := Key{Domain: domain, Name: ch.Name}
	if key.validate() != nil {
		return
	}
	ck := key.cacheKey()
	now := c.opts.Clock.Now()
	for _, sh := range *c.shards.Load() {
		if !sh.usesDomain(domain) {
			continue
		}
		c.mu.Lock()
		if f := c.flights[flightKey{shard: sh.id, key: key}]; f != nil {
			// A fetch is under way or pending: make sure its result is at least this new.
			if ch.Revision > f.minRevision {
				f.minRevision, f.changeDeleted = ch.Revision, ch.Deleted
			}
			if f.state == stateFailed && f.timer == nil && c.pushLocked(f) {
				f.state = stateQueued
			}
			c.mu.Unlock()
			continue
		}
		e, ok := sh.envelope(ck)
		if ok {
			_, ok = e.lookup(now)
		}
		var outdated bool
		switch {
		case !ok:
			// Nothing servable cached (expired, evicted, or never read
			// by this shard): fetching it for nobody would cost a call
			// per change, but the objects that read it must hear of it,
			// or they keep their old value until their next resync. Their
			// next Get fetches it.
			c.notifier.add(flightKey{shard: sh.id, key: key})
		case e.negative:
			outdated = !ch.Deleted
		default:
			outdated = ch.Revision != e.revision || ch.Deleted
		}
		if outdated {
			c.refreshLocked(sh, key, ck)
		}
		c.mu.Unlock()
	}
}

// recordNames keeps the domain's key names current with one answer of its feed. An answer from
// revision 0 lists every key, so from then on the set is complete.
func (c *Cache) recordNames(sub *subscription, a FeedAnswer) {
	c.feedsMu.Lock()
	defer c.feedsMu.Unlock()
	if sub.names == nil || a.Full {
		sub.names = make(map[string]struct{}, len(a.Changes))
	}
	for _, ch := range a.Changes {
		if ch.Deleted {
			delete(sub.names, ch.Name)
		} else {
			sub.names[ch.Name] = struct{}{}
		}
	}
	sub.synced = true
}

// KeyExists answers from the change feed alone whether a key exists: known is false unless a
// feed of the key's domain runs (a held shard uses the domain), has listed the domain and is
// healthy (an unhealthy feed's list may lack keys or keep deleted ones). It never calls the
// service, so an admission check can use it on the request path.
func (c *Cache) KeyExists(key Key) (exists, known bool) {
	c.feedsMu.Lock()
	defer c.feedsMu.Unlock()
	sub := c.feeds[key.Domain]
	if sub == nil || !sub.synced || c.feedErr(key.Domain) != nil {
		return false, false
	}
	_, exists = sub.names[key.Name]
	return exists, true
}
