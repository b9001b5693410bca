package externalcache_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/configcenter"
)

// TestReleaseDomainForgetsExactlyItsState: releasing a domain of a shard stops the domain's
// long poll (unless another shard uses it), ends its fetches (a Wait on one reads the key again
// and resolves), deletes the shard's entries of the domain and nothing else, and a later read
// starts afresh with a feed that reports changes again. A second release does nothing.
func TestReleaseDomainForgetsExactlyItsState(t *testing.T) {
	h := newHarness(t, setup{feed: true})
	a := externalcache.Key{Domain: "alpha", Name: "k"}
	b := externalcache.Key{Domain: "beta", Name: "k"}
	shared := externalcache.Key{Domain: "shared", Name: "k"}
	for _, k := range []externalcache.Key{a, b, shared} {
		h.put(k.Domain, k.Name, "v")
	}
	h.wait(1, a)
	h.wait(1, b)
	h.wait(1, shared)
	h.wait(2, shared)
	eventually(t, "three long polls wait", func() bool { return h.srv.WaitingPolls() == 3 })
	entriesBefore := h.cache.Stats().Entries

	// A fetch of alpha under way when alpha is released.
	slow := externalcache.Key{Domain: "alpha", Name: "slow"}
	h.put(slow.Domain, slow.Name, "v")
	h.setFaults(configcenter.Faults{Latency: configcenter.Duration{Duration: time.Second}})
	waited := make(chan externalcache.Lookup, 1)
	go func() {
		l, err := h.cache.Wait(context.Background(), 1, slow)
		if err != nil {
			t.Errorf("a Wait whose domain was released under it: %v, want it to read the key again", err)
		}
		waited <- l
	}()
	eventually(t, "the slow fetch is under way", func() bool { return h.cache.Stats().Flights == 1 })

	h.cache.ReleaseDomain(1, "alpha")
	h.cache.ReleaseDomain(1, "alpha") // idempotent
	h.cache.ReleaseDomain(1, "shared")
	h.cache.ReleaseDomain(3, "beta") // not used by shard 3: nothing

	h.setFaults(configcenter.Faults{})
	if l := <-waited; l.State != externalcache.StateFresh {
		t.Errorf("the Wait whose domain was released under it = %+v, want Fresh", l)
	}
	// The Wait used alpha again; release it once more, now with nothing in flight.
	h.cache.ReleaseDomain(1, "alpha")
	if got := h.cache.Domains(1); !slices.Equal(got, []string{"beta"}) {
		t.Errorf("shard 1's domains = %v, want [beta]", got)
	}
	if got := h.cache.FeedDomains(); !slices.Equal(got, []string{"beta", "shared"}) {
		t.Errorf("feeds = %v, want [beta shared]: shard 2 still uses shared", got)
	}
	eventually(t, "alpha's long poll ends", func() bool { return h.srv.WaitingPolls() == 2 })
	// Shard 1's alpha and shared entries go (the slow key's too); shard 2's shared and beta stay.
	eventually(t, "shard 1's entries of released domains are deleted", func() bool {
		return h.cache.Stats().Entries == entriesBefore-2
	})
	if s := h.cache.Stats(); s.Flights != 0 {
		t.Errorf("%d flights after the releases, want 0", s.Flights)
	}
	if l := h.cache.Get(2, shared); l.State != externalcache.StateFresh {
		t.Errorf("shard 2's shared key = %+v, want Fresh", l)
	}

	// Read again, alpha is used afresh: fetched, and its feed reports a change.
	callsBefore := h.calls("alpha", "k")
	if l := h.wait(1, a); l.State != externalcache.StateFresh || string(l.Value) != "v" {
		t.Fatalf("alpha after a new read = %+v", l)
	}
	if got := h.calls("alpha", "k"); got != callsBefore+1 {
		t.Errorf("alpha/k was fetched %d times after its release, want once", got-callsBefore)
	}
	eventually(t, "alpha's long poll is back", func() bool { return h.srv.WaitingPolls() == 3 })
	h.put(a.Domain, a.Name, "changed")
	eventually(t, "the change reaches the cache", func() bool {
		l := h.cache.Get(1, a)
		return l.State == externalcache.StateFresh && string(l.Value) == "changed"
	})
}

// TestReleaseRacingReadsLeavesNothing: reads of a domain racing its releases leave no entry and no
// flight of it once the domain is released with no read under way. A read uses the domain, then
// admits its fetch; a release between the two once let the fetch through for a domain the shard
// no longer used, whose entry no change feed kept fresh and no later release deleted (seen under
// load in TestReleaseDomainForgetsExactlyItsState).
func TestReleaseRacingReadsLeavesNothing(t *testing.T) {
	h := newHarness(t, setup{feed: true})
	const keys = 16
	for i := range keys {
		h.put("alpha", fmt.Sprint("k", i), "v")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				h.cache.Get(1, externalcache.Key{Domain: "alpha", Name: fmt.Sprint("k", i%keys)})
			}
		})
	}
	for range 3000 {
		h.cache.ReleaseDomain(1, "alpha")
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	h.cache.ReleaseDomain(1, "alpha")
	eventually(t, "no flight and no entry of the released domain", func() bool {
		s := h.cache.Stats()
		return s.Flights == 0 && s.Entries == 0
	})
	if got := h.cache.Domains(1); len(got) != 0 {
		t.Errorf("shard 1's domains = %v, want none", got)
	}
}
