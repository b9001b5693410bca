package externalcache

import (
	"github.com/prometheus/client_golang/prometheus"
	"sync"
	"time"

	"github.com/allegro/bigcache/v3"
)

// maxEvictions bounds the evicted entries remembered. Beyond it they are all forgotten: their
// refills then notify like arrivals, and their Lookups no longer carry ErrEvicted, which costs a
// requeue each, never a missed change.
const maxEvictions = 1 << 14

// evictions remembers the entries the store evicted to make room while they were still servable:
// their revision, so that a fetch that only brings one back is told from a change and notifies
// nobody, and their size, so that a Lookup of the missing key can say why it is missing. This is
// on the Go heap, a few dozen bytes per evicted key, only for keys evicted and not yet fetched
// again.
type evictions struct {
	now     func() time.Time
	counted prometheus.Counter

	mu    sync.Mutex
	byKey map[string]evicted // by store key (tenure prefix and cache key)
}

type evicted struct {
	revision int64
	negative bool
	// bytes is the entry's size in the store: its key and envelope.
	bytes int
}

func (e *evictions) init(now func() time.Time, counted prometheus.Counter) {
	e.now, e.counted = now, counted
	e.byKey = map[string]evicted{}
}

// record is bigcache's OnRemoveWithReason, filtered to NoSpace. bigcache calls it under one of its
// locks, from a Set that may run under Cache.mu: it must take neither.
func (e *evictions) record(key string, entry []byte, _ bigcache.RemoveReason) {
	env, err := decodeEnvelope(entry)
	if err != nil {
		return
	}
	if _, ok := env.lookup(e.now()); !ok {
		return // past its hard TTL: nothing servable was lost
	}
	e.counted.Inc()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.byKey) >= maxEvictions {
		clear(e.byKey)
	}
	e.byKey[key] = evicted{revision: env.revision, negative: env.negative, bytes: len(key) + len(entry)}
}

func (e *evictions) peek(key string) (evicted, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev, ok := e.byKey[key]
	return ev, ok
}

// take returns and forgets the eviction of key, when the key is stored again.
func (e *evictions) take(key string) (evicted, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev, ok := e.byKey[key]
	if ok {
		delete(e.byKey, key)
	}
	return ev, ok
}

// forget drops the evictions of dropped tenures and released domains (isDead).
func (e *evictions) forget(dead map[string]struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range e.byKey {
		if isDead(dead, k) {
			delete(e.byKey, k)
		}
	}
}
