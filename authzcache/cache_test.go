package authzcache

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// grants is a pure, in-memory authorization system for the cache's unit
// tests: a set of allowed questions at a revision, and a channel of
// changes for its Watcher. Tests against the real SpiceDB are in
// authzcache/spicedbsource.
type grants struct {
	mu      sync.Mutex
	allowed map[Question]bool
	rev     int
	asked   []string // atLeast of every Check
	froms   []string // from of every Watch
	changes chan string
	fail    chan error
}

func newGrants() *grants {
	return &grants{allowed: map[Question]bool{}, changes: make(chan string, 10), fail: make(chan error, 1)}
}

func (g *grants) Check(_ context.Context, qs []Question, atLeast string) ([]Decision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked = append(g.asked, atLeast)
	out := make([]Decision, len(qs))
	for i, q := range qs {
		out[i] = Decision{Allowed: g.allowed[q], Missing: "grant " + q.String()}
		if out[i].Allowed {
			out[i].Missing = ""
		}
	}
	return out, nil
}

func (g *grants) Watch(ctx context.Context, from string, changed func(string)) error {
	g.mu.Lock()
	g.froms = append(g.froms, from)
	g.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-g.fail:
			return err
		case rev := <-g.changes:
			changed(rev)
		}
	}
}

func (g *grants) set(q Question, allowed bool) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allowed[q] = allowed
	g.rev++
	return string(rune('a' + g.rev))
}

func (g *grants) lastAsked() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.asked[len(g.asked)-1]
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

func start(t *testing.T, g *grants, changed chan Question) *Cache {
	t.Helper()
	c, err := New(Options{Checker: g, Watcher: g, OnChange: func(q Question) { changed <- q }, Retry: RetryOptions{BaseDelay: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// TestDecideAndRevoke: a first answer arrives asynchronously and is told;
// a change makes it stale, never fresh, until it is checked again at least
// as fresh as the change; a changed answer is told again.
func TestDecideAndRevoke(t *testing.T) {
	g := newGrants()
	q := Question{Namespace: "team-a", Domain: "payments"}
	g.set(q, true)
	changed := make(chan Question, 10)
	c := start(t, g, changed)
	if _, st := c.Decide(q); st != Unknown {
		t.Fatalf("a first question: %v, want Unknown", st)
	}
	if got := <-changed; got != q {
		t.Fatalf("told %v, want %v", got, q)
	}
	if d, st := c.Decide(q); st != Fresh || !d.Allowed {
		t.Fatalf("after the answer: %+v %v, want allowed and Fresh", d, st)
	}

	// A change the cache has not checked again: the old answer is Stale.
	rev := g.set(q, false)
	c.invalidate(rev)
	if d, st := c.Decide(q); st != Stale || !d.Allowed {
		// The check may have answered already; then it must say denied.
		if !(st == Fresh && !d.Allowed) {
			t.Fatalf("right after a change: %+v %v, want the old answer Stale", d, st)
		}
	}
	if got := <-changed; got != q {
		t.Fatalf("told %v, want %v", got, q)
	}
	if d, st := c.Decide(q); st != Fresh || d.Allowed || d.Missing == "" {
		t.Fatalf("after the revocation: %+v %v, want denied, Fresh, naming the missing grant", d, st)
	}
	if got := g.lastAsked(); got != rev {
		t.Fatalf("checked again at least as fresh as %q, want %q", got, rev)
	}
}

// TestWatcherFailureChecksAllAgain: the Watcher failing (the system lost
// its history) makes every answer stale and checks them fully
// consistently, and a change it reports afterwards is followed.
func TestWatcherFailureChecksAllAgain(t *testing.T) {
	g := newGrants()
	a, b := Question{"team-a", "payments"}, Question{"team-b", "payments"}
	g.set(a, true)
	changed := make(chan Question, 10)
	c := start(t, g, changed)
	c.Decide(a)
	c.Decide(b)
	for range 2 {
		<-changed
	}
	g.set(a, false) // the system restarted empty: a is no longer allowed
	g.fail <- errors.New("stream reset")
	if got := <-changed; got != a {
		t.Fatalf("told %v, want %v", got, a)
	}
	if d, st := c.Decide(a); d.Allowed || st != Fresh {
		t.Fatalf("after the failure: %+v %v, want denied and Fresh", d, st)
	}
	eventually(t, "a fully consistent check", func() bool { return g.lastAsked() == "" })
	rev := g.set(b, true)
	g.changes <- rev
	if got := <-changed; got != b {
		t.Fatalf("told %v, want %v", got, b)
	}
}

// TestOneCheckPerBatch: many questions asked together are checked in
// batches of BatchSize, not one call each.
func TestOneCheckPerBatch(t *testing.T) {
	g := newGrants()
	c, err := New(Options{Checker: g, BatchSize: 50, RateLimit: 1000, RateBurst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 120 {
		c.Decide(Question{Namespace: "ns", Domain: string(rune('A' + i))})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Start(ctx) }()
	eventually(t, "120 answers", func() bool {
		n := 0
		for i := range 120 {
			if _, st := c.Decide(Question{Namespace: "ns", Domain: string(rune('A' + i))}); st == Fresh {
				n++
			}
		}
		return n == 120
	})
	if st := c.Stats(); st.Checks != 3 || st.Questions != 120 {
		t.Fatalf("stats %+v, want 3 checks of 120 questions", st)
	}
}

// TestAwait: a caller that may wait gets the first answer of a question
// asked for the first time.
func TestAwait(t *testing.T) {
	g := newGrants()
	q := Question{Namespace: "team-a", Domain: "payments"}
	g.set(q, true)
	c := start(t, g, make(chan Question, 10))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d, st := c.Await(ctx, q); st != Fresh || !d.Allowed {
		t.Fatalf("Await: %+v %v, want allowed and Fresh", d, st)
	}
}

// TestWatcherResumesWhereItStopped: a failed Watcher starts again from the
// last revision it reported, not from now (a change made between a
// re-check and a Watcher begun later would be lost); only a refused resume
// starts from now.
func TestWatcherResumesWhereItStopped(t *testing.T) {
	g := newGrants()
	changed := make(chan Question, 10)
	start(t, g, changed)
	froms := func() []string {
		g.mu.Lock()
		defer g.mu.Unlock()
		return append([]string(nil), g.froms...)
	}
	g.changes <- "r1"
	eventually(t, "a Watch", func() bool { return len(froms()) == 1 })
	// The change is taken before the failure: the channel is read in order
	// only when both are ready, so wait until it was reported.
	eventually(t, "r1 reported", func() bool { return len(g.changes) == 0 })
	g.fail <- errors.New("connection reset")
	eventually(t, "a second Watch", func() bool { return len(froms()) == 2 })
	if got := froms()[1]; got != "r1" {
		t.Fatalf("after a failure the Watcher started from %q, want r1, the last revision reported", got)
	}
	g.fail <- ErrResumeRefused
	eventually(t, "a third Watch", func() bool { return len(froms()) == 3 })
	if got := froms()[2]; got != "" {
		t.Fatalf("after a refused resume the Watcher started from %q, want now (\"\")", got)
	}
}
