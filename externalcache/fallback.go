package externalcache

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fallback refreshes cached keys at their soft expiry while their domain's change feed is
// unhealthy (FeedHealthOptions): the feed cannot be trusted to report their changes then. It is
// the fetcher's, guarded by fetcher.mu: a key with a flight is not armed, since its fetch arms it
// when it stores the value.
type fallback struct {
	f *fetcher
	// feedErr says why a domain's feed is unhealthy; nil while it is healthy.
	feedErr   func(domain string) error
	refreshes prometheus.Counter
	timers    map[flightKey]*ttlTimer
}

// ttlTimer refreshes one key of one shard's tenure at its soft expiry.
type ttlTimer struct {
	sh *shard
	t  *time.Timer
}

// armLocked has a cached key refreshed at its soft expiry (a not-found answer at its expiry)
// while its domain's change feed is unhealthy. A key being fetched is armed when its fetch stores
// it, and a key not cached when a read has it fetched; a timer that finds its entry refreshed
// meanwhile arms itself again.
func (b *fallback) armLocked(sh *shard, key Key, ck string) {
	if b.feedErr(key.Domain) == nil || b.f.endedLocked(sh) != nil {
		return
	}
	fk := flightKey{shard: sh.id, key: key}
	if b.f.flights[fk] != nil {
		return
	}
	if tt := b.timers[fk]; tt != nil {
		if tt.sh == sh {
			return
		}
		tt.t.Stop() // an earlier tenure's
	}
	e, ok := sh.envelope(ck)
	if !ok {
		delete(b.timers, fk)
		return
	}
	tt := &ttlTimer{sh: sh}
	tt.t = time.AfterFunc(max(0, time.Duration(e.softExpiry-b.f.opts.Clock.Now().UnixNano())), func() { b.expired(tt, key) })
	b.timers[fk] = tt
}

// expired refreshes a key whose soft TTL passed while its domain's feed is unhealthy; the
// fetch's arrival notifies OnUpdate if the value changed, and arms the next refresh.
func (b *fallback) expired(tt *ttlTimer, key Key) {
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	fk := flightKey{shard: tt.sh.id, key: key}
	if b.timers[fk] != tt {
		return
	}
	delete(b.timers, fk)
	if b.feedErr(key.Domain) == nil || b.f.endedLocked(tt.sh) != nil {
		return
	}
	ck := key.cacheKey()
	if e, ok := tt.sh.envelope(ck); ok && e.softExpiry > b.f.opts.Clock.Now().UnixNano() {
		b.armLocked(tt.sh, key, ck)
		return
	}
	b.refreshes.Inc()
	b.f.refreshLocked(tt.sh, key, ck)
}

// disarmLocked stops the timers that match.
func (b *fallback) disarmLocked(match func(flightKey, *ttlTimer) bool) {
	for fk, tt := range b.timers {
		if match(fk, tt) {
			tt.t.Stop()
			delete(b.timers, fk)
		}
	}
}
