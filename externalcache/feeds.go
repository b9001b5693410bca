package externalcache

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// feeds follows the change feed of every domain a held shard uses: one FeedLoop per domain per
// replica, whatever the number of keys or shards, started when the first shard uses the domain
// and stopped when the last one releases it. It keeps each feed's verdict (FeedHealthOptions),
// which Get reads without a lock, and each domain's key names, which KeyExists answers from. What
// an answer changes in the held shards is the cache's to do (changed), and so is what a new
// verdict means for them (judged).
type feeds struct {
	opts Options
	log  logr.Logger
	// ctx is the cache's lifetime, every loop's parent.
	ctx context.Context
	// hold is the guard's Retry-After hold, which holds the polls too.
	hold   *hold
	capped prometheus.Counter
	// changed applies one change a feed reported to the held shards.
	changed func(domain string, ch Change)
	// judged is told, after the log, that a domain's feed became unhealthy, changed its reason,
	// or healed.
	judged func(domain string, healed bool)
	wg     sync.WaitGroup
	loops  atomic.Int32

	mu   sync.Mutex
	subs map[string]*subscription
	// running is set between start and stop: a domain acquired then is followed at once; one
	// acquired before is followed from start on.
	running bool
	// troubled holds the domains whose feed is unhealthy, replaced whole under mu, so that Get
	// reads it without a lock.
	troubled atomic.Pointer[map[string]feedTrouble]
}

// subscription is the cache's change-feed subscription of one domain, shared by every held shard
// that uses the domain.
type subscription struct {
	refs   int
	cancel context.CancelFunc
	// names are the domain's existing keys as the feed last listed them, once synced: what
	// an admission check can answer without calling the service. Guarded by feeds.mu.
	names  map[string]struct{}
	synced bool
}

func newFeeds(ctx context.Context, opts Options, hold *hold, capped prometheus.Counter, log logr.Logger,
	changed func(string, Change), judged func(string, bool)) *feeds {
	f := &feeds{opts: opts, log: log, ctx: ctx, hold: hold, capped: capped, changed: changed, judged: judged,
		subs: map[string]*subscription{}}
	f.troubled.Store(&map[string]feedTrouble{})
	return f
}

// acquire counts one more shard using domain and starts its feed on the first.
func (f *feeds) acquire(domain string) {
	if f.opts.Feed == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sub := f.subs[domain]
	if sub == nil {
		sub = &subscription{}
		f.subs[domain] = sub
	}
	sub.refs++
	if f.running {
		f.startLocked(domain, sub)
	}
}

// release counts one shard less using domain and stops its feed on the last.
func (f *feeds) release(domain string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sub := f.subs[domain]
	if sub == nil {
		return
	}
	if sub.refs--; sub.refs > 0 {
		return
	}
	delete(f.subs, domain)
	f.forgetTroubleLocked(domain)
	if sub.cancel != nil {
		sub.cancel()
	}
}

// start follows the feeds of the domains in use, and of every domain acquired until stop.
func (f *feeds) start() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running = true
	for domain, sub := range f.subs {
		f.startLocked(domain, sub)
	}
}

// stop starts no more loops, and waits for the running ones, which end with the cache's context.
func (f *feeds) stop() {
	f.mu.Lock()
	f.running = false
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *feeds) startLocked(domain string, sub *subscription) {
	if sub.cancel != nil || sub.refs == 0 {
		return
	}
	ctx, cancel := context.WithCancel(f.ctx)
	sub.cancel = cancel
	f.wg.Go(func() { f.follow(ctx, domain, sub) })
}

// follow runs the domain's FeedLoop until ctx is done, through the guard's Retry-After hold: its
// answers are applied to the held shards, and its verdicts on the feed's health are judged after
// every poll.
func (f *feeds) follow(ctx context.Context, domain string, sub *subscription) {
	f.loops.Add(1)
	defer f.loops.Add(-1)
	log := f.log.WithValues("domain", domain)
	l, err := NewFeedLoop(FeedLoopOptions{Feed: f.opts.Feed, Domain: domain, Retry: f.opts.FeedRetry,
		MaxRetryAfter: f.opts.MaxRetryAfter, Health: f.opts.FeedHealth, Logger: log, hold: f.hold, capped: f.capped})
	if err != nil {
		log.Error(err, "Change feed not followed")
		return
	}
	log.V(1).Info("Change feed started")
	defer log.V(1).Info("Change feed stopped")
	l.Run(ctx, feedConsumer{feeds: f, domain: domain, sub: sub, loop: l})
}

// feedConsumer takes a domain's change feed into the cache.
type feedConsumer struct {
	feeds  *feeds
	domain string
	sub    *subscription
	loop   *FeedLoop
}

// Apply applies the changes of an answer, and records the domain's key names. It never fails: a
// key whose refresh fails is retried by the fetch path.
func (c feedConsumer) Apply(_ context.Context, a FeedAnswer) error {
	for _, ch := range a.Changes {
		c.feeds.changed(c.domain, ch)
	}
	c.feeds.recordNames(c.sub, a)
	return nil
}

// Polled judges the feed's health. A flap forgets the key names, which the listing after it
// brings again.
func (c feedConsumer) Polled(_ context.Context, p FeedPoll) error {
	if p.Flapped {
		c.feeds.mu.Lock()
		c.sub.names, c.sub.synced = nil, false
		c.feeds.mu.Unlock()
	}
	c.feeds.judge(c.domain, c.sub, c.loop.health)
	return nil
}

// recordNames keeps the domain's key names current with one answer of its feed. An answer from
// revision 0 lists every key, so from then on the set is complete.
func (f *feeds) recordNames(sub *subscription, a FeedAnswer) {
	f.mu.Lock()
	defer f.mu.Unlock()
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

// keyExists is Cache.KeyExists.
func (f *feeds) keyExists(key Key) (exists, known bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sub := f.subs[key.Domain]
	if sub == nil || !sub.synced || f.err(key.Domain) != nil {
		return false, false
	}
	_, exists = sub.names[key.Name]
	return exists, true
}

// domains lists the domains whose feed is subscribed, sorted.
func (f *feeds) domains() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.subs))
}

// err is the error of domain's unhealthy feed, nil while it is healthy. It is cheap: Get asks it
// for every key.
func (f *feeds) err(domain string) error {
	if m := *f.troubled.Load(); len(m) > 0 {
		return m[domain].err
	}
	return nil
}

// judge acts on the verdict h gives on sub's feed: a domain whose feed becomes unhealthy, changes
// its reason or heals is logged and told to judged. Errors of one reason are not told again: the
// first says it.
func (f *feeds) judge(domain string, sub *subscription, h *feedHealth) {
	why, err := h.verdict()
	f.mu.Lock()
	was := (*f.troubled.Load())[domain].why
	if f.subs[domain] != sub || was == why {
		// Released (a later loop judges itself), or nothing new.
		f.mu.Unlock()
		return
	}
	next := maps.Clone(*f.troubled.Load())
	if why == troubleNone {
		delete(next, domain)
	} else {
		next[domain] = feedTrouble{why: why, err: err}
	}
	f.troubled.Store(&next)
	f.mu.Unlock()

	log := f.log.WithValues("domain", domain)
	if why == troubleNone {
		log.Info("Change feed healthy again; values are refreshed when it reports a change", "was", was.String())
	} else {
		log.Info("Change feed unhealthy; values are refreshed on their soft TTL until it heals", "reason", why.String(), "error", err.Error())
	}
	f.judged(domain, why == troubleNone)
}

// forgetTroubleLocked drops the verdict of a domain whose feed stopped.
func (f *feeds) forgetTroubleLocked(domain string) {
	if _, ok := (*f.troubled.Load())[domain]; !ok {
		return
	}
	next := maps.Clone(*f.troubled.Load())
	delete(next, domain)
	f.troubled.Store(&next)
}

// unhealthy counts the domains whose feed is unhealthy for why.
func (f *feeds) unhealthy(why trouble) int {
	n := 0
	for _, t := range *f.troubled.Load() {
		if t.why == why {
			n++
		}
	}
	return n
}
