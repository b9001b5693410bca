package externalcache

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allegro/bigcache/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kshard/kshard/internal/backoff"
)

// store holds the values of every held shard off the Go heap, in one bigcache: each key prefixed
// with its shard's tenure, so that the held shards share MaxBytes however many they are, and a
// later tenure of a shard never reads an earlier one's entries. It owns what an entry is (an
// envelope with its TTLs), which entries were evicted for room, and the sweep that deletes the
// entries of dropped tenures and released domains in the background, so that dropping either
// stays O(1) on the handover path. It knows nothing of fetches or feeds.
type store struct {
	opts Options
	log  logr.Logger
	bc   *bigcache.BigCache
	// tenures numbers the shards' tenures: AddShard takes the next.
	tenures atomic.Uint64
	// evictions remembers the entries evicted for room while servable, so that their refill is
	// told from a change and their Lookups say why they are missing.
	evictions evictions

	// sweep asks the sweeper to delete the entries of dead prefixes.
	sweep  chan struct{}
	deadMu sync.Mutex
	dead   map[string]struct{} // tenure and domain prefixes whose entries are to be deleted
}

// newStore allocates the store; bigcache's cleaner runs until ctx ends.
func newStore(ctx context.Context, opts Options, evicted prometheus.Counter, log logr.Logger) (*store, error) {
	s := &store{opts: opts, log: log, sweep: make(chan struct{}, 1), dead: map[string]struct{}{}}
	s.evictions.init(opts.Clock.Now, evicted)
	bc, err := bigcache.New(ctx, opts.bigcacheConfig(s.evictions.record))
	if err != nil {
		return nil, fmt.Errorf("creating the external cache's store: %w", err)
	}
	s.bc = bc
	return s, nil
}

// tenurePrefixLen is the length of a shard's prefix in the store's keys.
const tenurePrefixLen = 8

// nextTenure numbers a new tenure and returns the prefix of its keys: the number, 8 bytes big
// endian.
func (s *store) nextTenure() (uint64, string) {
	t := s.tenures.Add(1)
	return t, string(binary.BigEndian.AppendUint64(nil, t))
}

// get decodes the entry under storeKey, if there is a readable one.
func (s *store) get(storeKey string) (envelope, bool) {
	b, err := s.bc.Get(storeKey)
	if err != nil {
		return envelope{}, false
	}
	e, err := decodeEnvelope(b)
	if err != nil {
		return envelope{}, false
	}
	return e, true
}

func (s *store) set(storeKey string, b []byte) error { return s.bc.Set(storeKey, b) }

func (s *store) delete(storeKey string) { _ = s.bc.Delete(storeKey) }

// entry is what a fetch's answer is stored as at now: a value, fresh for SoftTTL ± TTLJitter and
// servable for HardTTL, or a not-found answer, for NegativeTTL.
func (s *store) entry(v Value, negative bool, now time.Time) envelope {
	e := envelope{revision: v.Revision, fetchedAt: now.UnixNano(), negative: negative}
	if negative {
		e.revision = 0
		e.hardExpiry = now.Add(s.opts.NegativeTTL).UnixNano()
		e.softExpiry = e.hardExpiry
	} else {
		e.value = v.Data
		e.softExpiry = now.Add(s.softTTL()).UnixNano()
		e.hardExpiry = now.Add(s.opts.HardTTL).UnixNano()
	}
	return e
}

// softTTL is SoftTTL ± TTLJitter, so that keys fetched together do not expire together.
func (s *store) softTTL() time.Duration {
	d, j := float64(s.opts.SoftTTL), s.opts.TTLJitter
	return backoff.Between(time.Duration(d*(1-j)), time.Duration(d*(1+j)))
}

// expire makes the entry under storeKey stale at now, so that it is served while it is fetched
// again; a not-found answer is forgotten.
func (s *store) expire(storeKey string, now time.Time) {
	e, ok := s.get(storeKey)
	switch {
	case !ok:
	case e.negative:
		s.delete(storeKey)
	case e.softExpiry > now.UnixNano():
		e.softExpiry = now.UnixNano()
		_ = s.set(storeKey, appendEnvelope(make([]byte, 0, envelopeHeaderSize+len(e.value)), e))
	}
}

// forget has the sweeper delete the entries under prefix (a dropped tenure's, or a released
// domain's in a tenure): they can no longer be read, and their room is freed in the background.
func (s *store) forget(prefix string) {
	s.deadMu.Lock()
	s.dead[prefix] = struct{}{}
	s.deadMu.Unlock()
	select {
	case s.sweep <- struct{}{}:
	default:
	}
}

// keep takes prefix back from a sweep not yet begun: its domain is used again, and its new
// entries must stay.
func (s *store) keep(prefix string) {
	s.deadMu.Lock()
	delete(s.dead, prefix)
	s.deadMu.Unlock()
}

// sweeper deletes the entries of forgotten prefixes, one pass over the store per batch of them,
// until ctx ends.
func (s *store) sweeper(ctx context.Context) {
	for {
		select {
		case <-s.sweep:
		case <-ctx.Done():
			return
		}
		s.deadMu.Lock()
		dead := s.dead
		s.dead = map[string]struct{}{}
		s.deadMu.Unlock()
		if len(dead) == 0 {
			continue
		}
		removed := 0
		for it := s.bc.Iterator(); it.SetNext() && ctx.Err() == nil; {
			e, err := it.Value()
			if err != nil {
				continue
			}
			if isDead(dead, e.Key()) && s.bc.Delete(e.Key()) == nil {
				removed++
			}
		}
		s.evictions.forget(dead)
		s.log.V(1).Info("Deleted the entries of dropped shards and released domains", "prefixes", len(dead), "entries", removed)
	}
}

// isDead reports whether a store key is of a dropped tenure or of a released domain of a tenure:
// dead holds tenure prefixes and domain prefixes (shard.domainPrefix).
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

// evictedErr says why a pending key has no value when the store evicted it for room: the values
// the replica reads do not fit in MaxBytes together. Nil when it was not evicted.
func (s *store) evictedErr(storeKey string, key Key) error {
	ev, ok := s.evictions.peek(storeKey)
	if !ok {
		return nil
	}
	return fmt.Errorf("%w: the value of %s (%d bytes with its key) did not fit beside the others in its part of the cache "+
		"(MaxBytes %d over %d internal shards of %d bytes); it is being fetched again",
		ErrEvicted, key, ev.bytes, s.opts.MaxBytes, s.opts.InternalShards, s.opts.internalShardBytes())
}

// entries counts the entries of every held shard (and of dropped ones the sweeper has not
// deleted yet); bytes is what bigcache allocated for them.
func (s *store) entries() int { return s.bc.Len() }

func (s *store) bytes() int { return s.bc.Capacity() }
