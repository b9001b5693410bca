package spicedbsource_test

import (
	"context"
	"strings"
	"testing"
	"time"

	authzed "github.com/authzed/authzed-go/v1"

	"github.com/kshard/kshard/authzcache"
	"github.com/kshard/kshard/authzcache/spicedbsource"
	"github.com/kshard/kshard/internal/netfault"
	"github.com/kshard/kshard/internal/spicedbserver"
)

// startSpiceDB runs a SpiceDB of the test's own, with kshard's schema, and
// returns a client of it and a writer of its grants.
func startSpiceDB(t *testing.T) (*spicedbserver.Server, *authzed.Client, *spicedbserver.Grants) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs a SpiceDB process")
	}
	srv, err := spicedbserver.Start(context.Background(), spicedbserver.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	g, err := spicedbserver.Dial(srv.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	writeSchema(t, g)
	return srv, client(t, srv, srv.Endpoint()), g
}

// client connects to srv at endpoint (its own, or a proxy in front of it).
func client(t *testing.T, srv *spicedbserver.Server, endpoint string) *authzed.Client {
	t.Helper()
	o := srv.ClientOptions()
	o.Endpoint = endpoint
	c, err := spicedbsource.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func writeSchema(t *testing.T, g *spicedbserver.Grants) {
	t.Helper()
	if err := g.WriteSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// touch writes relationships; remove deletes them.
func touch(t *testing.T, g *spicedbserver.Grants, rels ...string) {
	t.Helper()
	if err := g.Touch(context.Background(), rels...); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, g *spicedbserver.Grants, rels ...string) {
	t.Helper()
	if err := g.Delete(context.Background(), rels...); err != nil {
		t.Fatal(err)
	}
}

const (
	direct   = "configdomain:payments#reader@kubernetes/namespace:team-a"
	teamRead = "configdomain:payments#reader@team:checkout#member"
	member   = "team:checkout#member@kubernetes/namespace:team-b"
)

var (
	teamA = authzcache.Question{Namespace: "team-a", Domain: "payments"}
	teamB = authzcache.Question{Namespace: "team-b", Domain: "payments"}
	teamC = authzcache.Question{Namespace: "team-c", Domain: "payments"}
)

// TestCheck: a direct grant and a grant through a team allow; a namespace
// with neither is denied, and the answer names the grant that is missing.
func TestCheck(t *testing.T) {
	_, c, g := startSpiceDB(t)
	touch(t, g, direct, teamRead, member)
	s, err := spicedbsource.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := s.Check(context.Background(), []authzcache.Question{teamA, teamB, teamC}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !ds[0].Allowed || !ds[1].Allowed || ds[2].Allowed {
		t.Fatalf("decisions %+v, want team-a and team-b allowed, team-c denied", ds)
	}
	if want := "configdomain:payments#reader@kubernetes/namespace:team-c"; !strings.Contains(ds[2].Missing, want) {
		t.Errorf("the denial says %q, want it to name %s", ds[2].Missing, want)
	}
	if ds[0].Revision == "" {
		t.Error("no revision (ZedToken) with the answers")
	}
}

// cacheOn starts an authzcache.Cache over SpiceDB at endpoint and returns
// it with the questions whose answers changed.
func cacheOn(t *testing.T, c *authzed.Client) (*authzcache.Cache, chan authzcache.Question) {
	t.Helper()
	return cacheWatchingOn(t, c, c)
}

// cacheWatchingOn is cacheOn with the Checks through one client and the
// Watch through another.
func cacheWatchingOn(t *testing.T, checks, watch *authzed.Client) (*authzcache.Cache, chan authzcache.Question) {
	t.Helper()
	checker, err := spicedbsource.New(checks)
	if err != nil {
		t.Fatal(err)
	}
	watcher, err := spicedbsource.New(watch)
	if err != nil {
		t.Fatal(err)
	}
	changed := make(chan authzcache.Question, 100)
	cache, err := authzcache.New(authzcache.Options{Checker: checker, Watcher: watcher, Retry: authzcache.RetryOptions{BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second},
		OnChange: func(q authzcache.Question) { changed <- q }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = cache.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return cache, changed
}

// decided waits until q's decision is Fresh with allowed.
func decided(t *testing.T, cache *authzcache.Cache, q authzcache.Question, allowed bool) authzcache.Decision {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		d, st := cache.Decide(q)
		if st == authzcache.Fresh && d.Allowed == allowed {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v: %+v %v, want allowed=%v and Fresh", q, d, st, allowed)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRevokedThroughTheTeam: the invalidation is sound. Removing team-b
// from the team changes no relationship of the domain, yet team-b's
// decision turns to denied; removing the direct grant denies team-a.
func TestRevokedThroughTheTeam(t *testing.T) {
	_, c, g := startSpiceDB(t)
	touch(t, g, direct, teamRead, member)
	cache, changed := cacheOn(t, c)
	decided(t, cache, teamA, true)
	decided(t, cache, teamB, true)
	decided(t, cache, teamC, false)

	remove(t, g, member)
	decided(t, cache, teamB, false)
	decided(t, cache, teamA, true)
	remove(t, g, direct)
	decided(t, cache, teamA, false)
	// A grant given later allows without a restart.
	touch(t, g, "configdomain:payments#reader@kubernetes/namespace:team-c")
	decided(t, cache, teamC, true)
	told := map[authzcache.Question]int{}
	for len(changed) > 0 {
		told[<-changed]++
	}
	for _, q := range []authzcache.Question{teamA, teamB, teamC} {
		if told[q] < 2 {
			t.Errorf("%v told %d times, want its first answer and its change", q, told[q])
		}
	}
}

// TestSpiceDBRestarted: an in-memory SpiceDB restarted has lost every
// relationship; the cache does not keep serving its old grants as fresh:
// they turn to denied once it answers again.
func TestSpiceDBRestarted(t *testing.T) {
	srv, c, g := startSpiceDB(t)
	touch(t, g, direct)
	cache, _ := cacheOn(t, c)
	decided(t, cache, teamA, true)
	srv.Stop(5 * time.Second)
	if err := srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	writeSchema(t, g)
	decided(t, cache, teamA, false)
}

// TestUnreachableAtStart: with SpiceDB not up yet a question stays
// Unknown (never allowed by default); once it answers, the decision
// arrives.
func TestUnreachableAtStart(t *testing.T) {
	srv, c, g := startSpiceDB(t)
	touch(t, g, direct)
	srv.Stop(5 * time.Second)
	cache, _ := cacheOn(t, c)
	for range 10 {
		if d, st := cache.Decide(teamA); st != authzcache.Unknown {
			t.Fatalf("with SpiceDB down: %+v %v, want Unknown", d, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	writeSchema(t, g)
	touch(t, g, direct)
	decided(t, cache, teamA, true)
}

// TestWatchCut: the connection under the Watch is cut mid-stream, and
// the new Watch reaches SpiceDB only after a grant was removed, while the
// decisions were checked again before it: the removal is still seen. (A
// Watch started again "from now" would begin after the removal and never
// report it; the Checks go through a connection of their own, so that the
// delay holds back only the Watch.)
func TestWatchCut(t *testing.T) {
	srv, _, g := startSpiceDB(t)
	touch(t, g, direct, teamRead, member)
	proxy, err := netfault.Listen(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cache, _ := cacheWatchingOn(t, client(t, srv, srv.Endpoint()), client(t, srv, proxy.Addr()))
	decided(t, cache, teamB, true)
	checks := cache.Stats().Checks
	proxy.Delay(3 * time.Second)
	if n := proxy.Cut(); n == 0 {
		t.Fatal("no connection to cut")
	}
	// The failed Watch makes every decision stale; wait until they were
	// checked again, before the removal.
	for deadline := time.Now().Add(time.Minute); cache.Stats().Checks == checks; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the decisions were not checked again after the Watch failed")
		}
	}
	decided(t, cache, teamB, true)
	remove(t, g, member)
	decided(t, cache, teamB, false)
}

// TestParseRelationship: the notation with and without a subject relation,
// and a malformed one refused.
func TestParseRelationship(t *testing.T) {
	r, err := spicedbsource.ParseRelationship("configdomain:payments#reader@team:checkout#member")
	if err != nil || r.GetResource().GetObjectId() != "payments" || r.GetRelation() != "reader" ||
		r.GetSubject().GetObject().GetObjectType() != "team" || r.GetSubject().GetOptionalRelation() != "member" {
		t.Fatalf("parsed %v, %v", r, err)
	}
	if _, err := spicedbsource.ParseRelationship("configdomain:payments@team:checkout"); err == nil {
		t.Error("a relationship without a relation was parsed")
	}
}
