package externalcache

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

func newTestStore(t *testing.T) *store {
	t.Helper()
	o := Options{Source: nopSource{}, MaxBytes: 4 << 20, InternalShards: 4}
	o.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := newStore(ctx, o, prometheus.NewCounter(prometheus.CounterOpts{Name: "evicted"}), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	go s.sweeper(ctx)
	return s
}

// TestStoreSweepsForgottenPrefixes: the store alone deletes the entries of a forgotten tenure and
// of a forgotten domain of a tenure, and keeps the others, and a domain taken back before the
// sweep keeps its entries.
func TestStoreSweepsForgottenPrefixes(t *testing.T) {
	s := newTestStore(t)
	now := time.Now()
	_, dropped := s.nextTenure()
	_, kept := s.nextTenure()
	put := func(prefix string, key Key) string {
		k := prefix + key.cacheKey()
		e := s.entry(Value{Data: []byte("v"), Revision: 1}, false, now)
		if err := s.set(k, appendEnvelope(nil, e)); err != nil {
			t.Fatal(err)
		}
		return k
	}
	gone := put(dropped, Key{Domain: "d", Name: "a"})
	released := put(kept, Key{Domain: "released", Name: "a"})
	usedAgain := put(kept, Key{Domain: "again", Name: "a"})
	stays := put(kept, Key{Domain: "d", Name: "a"})

	// Forgotten (without waking the sweeper yet), then taken back before the sweep.
	s.deadMu.Lock()
	s.dead[kept+"again\x00"] = struct{}{}
	s.deadMu.Unlock()
	s.keep(kept + "again\x00")
	s.forget(dropped)
	s.forget(kept + "released\x00")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, a := s.get(gone)
		_, b := s.get(released)
		if !a && !b {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("forgotten entries still stored: tenure's %v, domain's %v", a, b)
		}
	}
	for _, k := range []string{usedAgain, stays} {
		if _, ok := s.get(k); !ok {
			t.Errorf("entry %q swept with the forgotten prefixes", k)
		}
	}
}

// TestStoreExpire: expiring a value makes it stale at once and keeps it servable; expiring a
// not-found answer forgets it.
func TestStoreExpire(t *testing.T) {
	s := newTestStore(t)
	now := time.Now()
	_, p := s.nextTenure()
	v, nf := p+Key{Domain: "d", Name: "v"}.cacheKey(), p+Key{Domain: "d", Name: "nf"}.cacheKey()
	_ = s.set(v, appendEnvelope(nil, s.entry(Value{Data: []byte("x"), Revision: 3}, false, now)))
	_ = s.set(nf, appendEnvelope(nil, s.entry(Value{}, true, now)))
	s.expire(v, now)
	s.expire(nf, now)
	e, ok := s.get(v)
	if !ok {
		t.Fatal("an expired value was forgotten")
	}
	if l, _ := e.lookup(now); l.State != StateStale || string(l.Value) != "x" || l.Revision != 3 {
		t.Errorf("expired value: %+v, want it stale with its value", l)
	}
	if _, ok := s.get(nf); ok {
		t.Error("an expired not-found answer is still stored")
	}
}
