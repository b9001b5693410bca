package etcdsource_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/controlplane"
)

// startEtcd runs a config-center etcd for one test, of the control plane's
// binary (the user's KUBEBUILDER_ASSETS, or what make controlplane builds).
func startEtcd(t *testing.T) (*configetcd.Server, *clientv3.Client) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs an etcd process")
	}
	srv, err := configetcd.Start(context.Background(), configetcd.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return srv, c
}

func newSource(t *testing.T, c *clientv3.Client, poll time.Duration) *etcdsource.Source {
	t.Helper()
	s, err := etcdsource.New(etcdsource.Options{Client: c, PollTimeout: poll})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newWatchSource is newSource with a watch per poll, or one shared watch.
func newWatchSource(t *testing.T, c *clientv3.Client, poll time.Duration, shared bool) *etcdsource.Source {
	t.Helper()
	s, err := etcdsource.New(etcdsource.Options{Client: c, PollTimeout: poll, WatchPerPoll: !shared})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// forEachWatch runs a test of the feed with a watch per poll and with one
// shared watch.
func forEachWatch(t *testing.T, test func(t *testing.T, shared bool)) {
	t.Run("watch-per-poll", func(t *testing.T) { test(t, false) })
	t.Run("shared-watch", func(t *testing.T) { test(t, true) })
}

func put(t *testing.T, c *clientv3.Client, key, value string) int64 {
	t.Helper()
	resp, err := c.Put(context.Background(), etcdsource.DefaultPrefix+"/"+key, value)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// TestFetch: a value and its revision, a change, a delete, a missing key, and
// a key of a domain whose name another domain's begins with.
func TestFetch(t *testing.T) {
	_, c := startEtcd(t)
	s := newSource(t, c, time.Second)
	ctx := context.Background()
	rev := put(t, c, "payments/limit", "100")
	put(t, c, "payments-eu/limit", "7")
	v, err := s.Fetch(ctx, externalcache.Key{Domain: "payments", Name: "limit"})
	if err != nil || string(v.Data) != "100" || v.Revision != rev {
		t.Fatalf("Fetch = %q at %d, %v; want 100 at %d", v.Data, v.Revision, err, rev)
	}
	rev = put(t, c, "payments/limit", "200")
	if v, err = s.Fetch(ctx, externalcache.Key{Domain: "payments", Name: "limit"}); err != nil || string(v.Data) != "200" || v.Revision != rev {
		t.Fatalf("after a change: %q at %d, %v; want 200 at %d", v.Data, v.Revision, err, rev)
	}
	if _, err := c.Delete(ctx, etcdsource.DefaultPrefix+"/payments/limit"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fetch(ctx, externalcache.Key{Domain: "payments", Name: "limit"}); !errors.Is(err, externalcache.ErrNotFound) {
		t.Fatalf("a deleted key: %v, want ErrNotFound", err)
	}
	if _, err := s.Fetch(ctx, externalcache.Key{Domain: "payments", Name: "nothing"}); !errors.Is(err, externalcache.ErrNotFound) {
		t.Fatalf("a missing key: %v, want ErrNotFound", err)
	}
}

// TestChanges: the first poll lists the domain, and no other; a later poll
// returns the changes after it, a delete among them; an idle poll answers
// after PollTimeout with the revision etcd's progress notification names.
func TestChanges(t *testing.T) { forEachWatch(t, testChanges) }

func testChanges(t *testing.T, shared bool) {
	_, c := startEtcd(t)
	s := newWatchSource(t, c, 500*time.Millisecond, shared)
	ctx := context.Background()
	put(t, c, "payments/a", "1")
	put(t, c, "payments/b", "2")
	put(t, c, "payments-eu/c", "3")
	all, err := s.Changes(ctx, "payments", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Changes) != 2 || all.Changes[0].Name != "a" || all.Changes[1].Name != "b" || all.Epoch == "" {
		t.Fatalf("the first poll: %+v, want keys a and b and an epoch", all)
	}
	rev := put(t, c, "payments/a", "10")
	if _, err := c.Delete(ctx, etcdsource.DefaultPrefix+"/payments/b"); err != nil {
		t.Fatal(err)
	}
	got := map[string]externalcache.Change{}
	since := all.Revision
	for len(got) < 2 {
		cs, err := s.Changes(ctx, "payments", since)
		if err != nil {
			t.Fatal(err)
		}
		if cs.Epoch != all.Epoch || cs.Revision < since {
			t.Fatalf("a poll from %d: %+v, the history changed", since, cs)
		}
		for _, ch := range cs.Changes {
			got[ch.Name] = ch
		}
		since = cs.Revision
	}
	if got["a"].Revision != rev || got["a"].Deleted || !got["b"].Deleted {
		t.Fatalf("changes %+v, want a changed at %d and b deleted", got, rev)
	}
	put(t, c, "payments-eu/c", "30") // another domain's change
	idle, err := s.Changes(ctx, "payments", since)
	if err != nil {
		t.Fatal(err)
	}
	if len(idle.Changes) != 0 || idle.Revision < since {
		t.Fatalf("an idle poll from %d: %+v, want no change and a revision at least %d", since, idle, since)
	}
}

// TestIdleAnswerNamesTheHistory: with the shared watch, in an etcd where
// nothing changes after the list, a poll answers after PollTimeout in the
// list's history: the same epoch, a revision no lower. (An answer without
// the epoch would have the cache list the domain again; a watch per poll
// waits instead, since etcd sends no progress notification to a watch
// that starts after its current revision.)
func TestIdleAnswerNamesTheHistory(t *testing.T) {
	_, c := startEtcd(t)
	s := newWatchSource(t, c, 300*time.Millisecond, true)
	ctx := context.Background()
	put(t, c, "payments/a", "1")
	all, err := s.Changes(ctx, "payments", 0)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := s.Changes(ctx, "payments", all.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if idle.Epoch != all.Epoch || idle.Revision < all.Revision || len(idle.Changes) != 0 {
		t.Fatalf("an idle poll after the list %+v: %+v, want the same epoch, no change, a revision of at least %d", all, idle, all.Revision)
	}
}

// TestCompactedWhileAway: a replica followed the domain to revision r and
// stopped; the key changed, and etcd compacted the history past the change.
// The poll from r answers with revision 0, lower than asked: the cache lists
// the domain again, and finds the change.
func TestCompactedWhileAway(t *testing.T) { forEachWatch(t, testCompactedWhileAway) }

func testCompactedWhileAway(t *testing.T, shared bool) {
	_, c := startEtcd(t)
	s := newWatchSource(t, c, time.Second, shared)
	ctx := context.Background()
	put(t, c, "payments/limit", "100")
	first, err := s.Changes(ctx, "payments", 0)
	if err != nil {
		t.Fatal(err)
	}
	rev := put(t, c, "payments/limit", "200")
	put(t, c, "other/x", "1")
	if _, err := c.Compact(ctx, rev+1); err != nil {
		t.Fatal(err)
	}
	// The replica starts again: a Source of its own, from what it had.
	s = newWatchSource(t, c, time.Second, shared)
	cs, err := s.Changes(ctx, "payments", first.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if cs.Revision >= first.Revision {
		t.Fatalf("a poll from a compacted revision: %+v, want a revision lower than %d", cs, first.Revision)
	}
	again, err := s.Changes(ctx, "payments", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Changes) != 1 || again.Changes[0].Revision != rev {
		t.Fatalf("listed again: %+v, want limit at %d", again, rev)
	}
}

// TestEtcdRestarted: a poll while etcd is down fails as retryable (not
// rejected), and the same history is followed once it is back.
func TestEtcdRestarted(t *testing.T) { forEachWatch(t, testEtcdRestarted) }

func testEtcdRestarted(t *testing.T, shared bool) {
	srv, c := startEtcd(t)
	s := newWatchSource(t, c, time.Second, shared)
	ctx := context.Background()
	put(t, c, "payments/limit", "100")
	first, err := s.Changes(ctx, "payments", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = s.Fetch(fctx, externalcache.Key{Domain: "payments", Name: "limit"})
	cancel()
	if err == nil || errors.Is(err, externalcache.ErrRejected) {
		t.Fatalf("a fetch with etcd down: %v, want a retryable failure", err)
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	rev := put(t, c, "payments/limit", "200")
	controlplane.Eventually(t, time.Minute, "the change after the restart", func() error {
		cs, err := s.Changes(ctx, "payments", first.Revision)
		if err != nil {
			return err
		}
		if cs.Epoch != first.Epoch || len(cs.Changes) != 1 || cs.Changes[0].Revision != rev {
			return errors.New("not yet")
		}
		return nil
	})
}

// TestNotPermitted: etcd refuses a user without a read grant on the prefix
// as the caller's mistake: ErrRejected, which the cache neither retries soon
// nor counts against etcd. A wrong password is refused when the client is
// built, before any read.
func TestNotPermitted(t *testing.T) {
	srv, c := startEtcd(t)
	ctx := context.Background()
	for _, step := range []func() error{
		func() error { _, err := c.UserAdd(ctx, "root", "root-pw"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := c.RoleAdd(ctx, "nothing"); return err },
		func() error { _, err := c.UserAdd(ctx, "kshard", "kshard-pw"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "kshard", "nothing"); return err },
		func() error { _, err := c.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	user := func(name, password string) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Username: name, Password: password, DialTimeout: 5 * time.Second})
	}
	ungranted, err := user("kshard", "kshard-pw")
	if err != nil {
		t.Fatal(err)
	}
	defer ungranted.Close()
	_, err = newSource(t, ungranted, time.Second).Fetch(ctx, externalcache.Key{Domain: "payments", Name: "limit"})
	if !errors.Is(err, externalcache.ErrRejected) {
		t.Errorf("a read without a grant: %v, want ErrRejected", err)
	}
	if wrong, err := user("kshard", "wrong"); err == nil {
		wrong.Close()
		t.Error("a client with a wrong password was built")
	} else if !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Errorf("a wrong password: %v, want etcd's authentication failure", err)
	}
}
