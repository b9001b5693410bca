package externalcache

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// listOnce lists every domain with one key at revision 1, and then holds each poll open until it
// is cancelled.
type listOnce struct{}

func (listOnce) Changes(ctx context.Context, _ string, since int64) (ChangeSet, error) {
	if since == 0 {
		return ChangeSet{Revision: 1, Changes: []Change{{Name: "a", Revision: 1}}}, nil
	}
	<-ctx.Done()
	return ChangeSet{}, ctx.Err()
}

// TestFeedsFollowEachDomainOnce: the feeds alone run one loop per domain in use, however many
// shards use it, from start on; hand its changes to the cache; list its names; and stop the loop
// when the last shard releases the domain.
func TestFeedsFollowEachDomainOnce(t *testing.T) {
	o := Options{Source: nopSource{}, Feed: listOnce{}}
	o.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var changes []string
	f := newFeeds(ctx, o, &hold{}, prometheus.NewCounter(prometheus.CounterOpts{Name: "capped"}), logr.Discard(),
		func(domain string, ch Change) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, domain+"/"+ch.Name)
		},
		func(string, bool) { t.Error("a healthy feed was judged") })
	defer func() { cancel(); f.stop() }()
	eventually := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}

	f.acquire("d")
	f.acquire("d") // a second shard
	if n := f.loops.Load(); n != 0 {
		t.Fatalf("%d loops before start", n)
	}
	f.start()
	f.acquire("e")
	eventually("both domains listed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(changes) == 2
	})
	if n := f.loops.Load(); n != 2 {
		t.Errorf("%d loops for two domains", n)
	}
	slices.Sort(changes)
	if !slices.Equal(changes, []string{"d/a", "e/a"}) {
		t.Errorf("changes handed to the cache: %v", changes)
	}
	eventually("the names listed", func() bool { _, known := f.keyExists(Key{Domain: "d", Name: "a"}); return known })
	if exists, _ := f.keyExists(Key{Domain: "d", Name: "b"}); exists {
		t.Error("a key the feed never listed exists")
	}
	if got := f.domains(); !slices.Equal(got, []string{"d", "e"}) {
		t.Errorf("domains = %v", got)
	}

	f.release("d")
	if got := f.domains(); !slices.Equal(got, []string{"d", "e"}) {
		t.Errorf("after one of two shards released d: domains = %v", got)
	}
	f.release("d")
	eventually("d's loop stopped", func() bool { return f.loops.Load() == 1 })
	if _, known := f.keyExists(Key{Domain: "d", Name: "a"}); known {
		t.Error("a released domain's names are still known")
	}
}
