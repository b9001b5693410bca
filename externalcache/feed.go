package externalcache

import (
	"context"
	"math/rand/v2"
	"time"
)

// feedLoop is the change-feed subscription of one domain, shared by every held shard that uses
// the domain: one long poll per domain per replica, whatever the number of keys.
type feedLoop struct {
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
	fl := c.feeds[domain]
	if fl == nil {
		fl = &feedLoop{}
		c.feeds[domain] = fl
	}
	fl.refs++
	if c.running {
		c.startFeedLocked(domain, fl)
	}
}

// releaseDomain counts one shard less using domain and stops its feed on the last.
func (c *Cache) releaseDomain(domain string) {
	c.feedsMu.Lock()
	defer c.feedsMu.Unlock()
	fl := c.feeds[domain]
	if fl == nil {
		return
	}
	if fl.refs--; fl.refs > 0 {
		return
	}
	delete(c.feeds, domain)
	c.forgetTroubleLocked(domain)
	if fl.cancel != nil {
		fl.cancel()
	}
}

func (c *Cache) startFeedLocked(domain string, fl *feedLoop) {
	if fl.cancel != nil || fl.refs == 0 {
		return
	}
	ctx, cancel := context.WithCancel(c.ctx)
	fl.cancel = cancel
	c.wg.Go(func() { c.runFeed(ctx, domain, fl) })
}

// runFeed polls the domain's change feed until ctx is done. It starts from revision 0, so the
// first answer lists every key of the domain with its revision and any key cached before the
// feed started is checked; it backs off on errors (never earlier than a Retry-After), polls not
// while the cache's Retry-After hold lasts (a fetch's or a poll's: the source asked every caller
// to wait), and resynchronises from 0 when the source restarted and lost its history. It judges
// the feed's health after every poll (FeedHealthOptions), and backs off when the source's
// history flaps, as after errors.
func (c *Cache) runFeed(ctx context.Context, domain string, fl *feedLoop) {
	c.feedLoops.Add(1)
	defer c.feedLoops.Add(-1)
	log := c.log.WithValues("domain", domain)
	log.V(1).Info("Change feed started")
	defer log.V(1).Info("Change feed stopped")
	var since int64
	var epoch string
	failures, flaps := 0, 0
	health := NewFeedHealth(c.opts.FeedHealth, c.opts.FeedRetry.MinInterval)
	for {
		// The source's Retry-After holds every call, polls included, whoever was told.
		if d := c.hold.remaining(); d > 0 {
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		start := time.Now()
		cs, err := c.opts.Feed.Changes(ctx, domain, since)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			health.Failed(err)
			c.judgeFeed(domain, fl, health)
			hint := retryAfterHint(err, c.opts.MaxRetryAfter)
			if hint > 0 {
				c.hold.extend(hint)
			}
			d := max(feedBackoff(c.opts.FeedRetry.BaseDelay, c.opts.FeedRetry.MaxDelay, failures-1), hint)
			if failures == 1 {
				log.Info("Change feed failed; backing off", "error", err.Error(), "retryIn", d)
			} else {
				log.V(1).Info("Change feed failed again", "error", err.Error(), "failures", failures, "retryIn", d)
			}
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		if failures > 0 {
			log.Info("Change feed recovered", "failures", failures)
			failures = 0
		}
		if cs.Revision < since || (epoch != "" && cs.Epoch != epoch) {
			flap := health.HistoryLost(epoch, cs.Epoch)
			c.judgeFeed(domain, fl, health)
			if !flap {
				log.Info("Change feed source lost its history (restarted?); resynchronising",
					"hadRevision", since, "revision", cs.Revision, "hadEpoch", epoch, "epoch", cs.Epoch)
			}
			since, epoch = 0, cs.Epoch
			c.feedsMu.Lock()
			fl.names, fl.synced = nil, false
			c.feedsMu.Unlock()
			if !flap {
				flaps = 0
				continue
			}
			// Relisting at once would list the domain at every poll while the histories
			// alternate.
			flaps++
			d := feedBackoff(c.opts.FeedRetry.BaseDelay, c.opts.FeedRetry.MaxDelay, flaps-1)
			log.V(1).Info("Change feed source's history flaps; resynchronising after a backoff", "epoch", cs.Epoch, "flaps", flaps, "retryIn", d)
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		flaps = 0
		epoch = cs.Epoch
		for _, ch := range cs.Changes {
			c.applyChange(domain, ch)
		}
		c.recordNames(fl, cs.Changes)
		since = cs.Revision
		health.Answered(cs.Epoch, len(cs.Changes), time.Since(start))
		c.judgeFeed(domain, fl, health)
		if len(cs.Changes) == 0 {
			if el := time.Since(start); el < c.opts.FeedRetry.MinInterval && !sleep(ctx, c.opts.FeedRetry.MinInterval-el) {
				return
			}
		}
	}
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
	now := c.opts.Now()
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

// recordNames keeps the domain's key names current with one answer of its feed. The first
// answer (from revision 0) lists every key, so from then on the set is complete.
func (c *Cache) recordNames(fl *feedLoop, changes []Change) {
	c.feedsMu.Lock()
	defer c.feedsMu.Unlock()
	if fl.names == nil {
		fl.names = make(map[string]struct{}, len(changes))
	}
	for _, ch := range changes {
		if ch.Deleted {
			delete(fl.names, ch.Name)
		} else {
			fl.names[ch.Name] = struct{}{}
		}
	}
	fl.synced = true
}

// KeyExists answers from the change feed alone whether a key exists: known is false unless a
// feed of the key's domain runs (a held shard uses the domain), has listed the domain and is
// healthy (an unhealthy feed's list may lack keys or keep deleted ones). It never calls the
// service, so an admission check can use it on the request path.
func (c *Cache) KeyExists(key Key) (exists, known bool) {
	c.feedsMu.Lock()
	defer c.feedsMu.Unlock()
	fl := c.feeds[key.Domain]
	if fl == nil || !fl.synced || c.feedErr(key.Domain) != nil {
		return false, false
	}
	_, exists = fl.names[key.Name]
	return exists, true
}

// feedBackoff is exponential backoff with "equal jitter" (half fixed, half random): a feed loop
// must not spin when every poll fails at once, which full jitter near zero would allow.
func feedBackoff(base, maxDelay time.Duration, attempt int) time.Duration {
	d := maxDelay
	if attempt < 30 {
		d = min(maxDelay, base<<attempt)
	}
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
