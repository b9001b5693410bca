package etcdsource_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/netfault"
)

// pollUntil polls a domain's feed from since, as the cache does, until an
// answer carries name at revision rev. An answer that lost the history
// (revision 0) starts over from a list; a failed poll is retried unless
// it is a refusal (ErrRejected), which no retry heals. It fails the test
// after a minute, a bound for a hang, not a speed.
func pollUntil(t *testing.T, s *etcdsource.Source, domain string, since int64, name string, rev int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cs, err := s.Changes(ctx, domain, since)
		cancel()
		switch {
		case errors.Is(err, externalcache.ErrRejected):
			t.Fatalf("a poll was refused: %v", err)
		case err != nil:
			last = err
			time.Sleep(200 * time.Millisecond)
			continue
		}
		for _, ch := range cs.Changes {
			if ch.Name == name && ch.Revision == rev {
				return
			}
		}
		since = cs.Revision
	}
	t.Fatalf("the feed of %s never told %s at revision %d (last error: %v)", domain, name, rev, last)
}

// TestLeaderLost: a three-member etcd loses its leader while a replica
// follows a domain. The survivors elect another, a value changed then
// reaches the feed and a read, and the stopped member, started again,
// catches up.
func TestLeaderLost(t *testing.T) { forEachWatch(t, testLeaderLost) }

func testLeaderLost(t *testing.T, shared bool) {
	if testing.Short() {
		t.Skip("runs etcd processes")
	}
	ctx := context.Background()
	srv, err := configetcd.Start(ctx, configetcd.Options{Dir: t.TempDir(), Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s := newWatchSource(t, c, time.Second, shared)
	put(t, c, "payments/limit", "100")
	first, err := s.Changes(ctx, "payments", 0)
	if err != nil {
		t.Fatal(err)
	}

	leader, err := srv.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srv.StopMember(leader, 5*time.Second)
	var rev int64
	deadline := time.Now().Add(time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.Put(pctx, etcdsource.DefaultPrefix+"/payments/limit", "200")
		cancel()
		if err == nil {
			rev = resp.Header.Revision
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write through the two members left: %v", err)
		}
	}
	if now, err := srv.Leader(ctx); err != nil || now == leader {
		t.Fatalf("leader after the loss: member %d (%v), the lost one was %d", now, err, leader)
	}
	pollUntil(t, s, "payments", first.Revision, "limit", rev)
	if v, err := s.Fetch(ctx, externalcache.Key{Domain: "payments", Name: "limit"}); err != nil || string(v.Data) != "200" || v.Revision != rev {
		t.Fatalf("Fetch after the leader loss: %q at %d, %v; want 200 at %d", v.Data, v.Revision, err, rev)
	}

	if err := srv.RestartMember(ctx, leader); err != nil {
		t.Fatal(err)
	}
	only, err := etcdsource.NewClient(etcdsource.ClientOptions{Servers: []string{srv.Endpoints()[leader]}})
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	back := newSource(t, only, time.Second)
	deadline = time.Now().Add(time.Minute)
	for {
		v, err := back.Fetch(ctx, externalcache.Key{Domain: "payments", Name: "limit"})
		if err == nil && string(v.Data) == "200" && v.Revision == rev {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the member that led, started again, reads %q at %d (%v); want 200 at %d", v.Data, v.Revision, err, rev)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestWatchCut: the connection under a watch is cut mid-stream (a load
// balancer dropping its flows) while a poll waits. A change made
// meanwhile reaches the feed, resumed on a new connection.
func TestWatchCut(t *testing.T) { forEachWatch(t, testWatchCut) }

func testWatchCut(t *testing.T, shared bool) {
	srv, direct := startEtcd(t)
	proxy, err := netfault.Listen(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	c, err := etcdsource.NewClient(etcdsource.ClientOptions{Servers: []string{"http://" + proxy.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newWatchSource(t, c, 10*time.Second, shared)
	ctx := context.Background()
	put(t, direct, "payments/limit", "100")
	first, err := s.Changes(ctx, "payments", 0)
	if err != nil {
		t.Fatal(err)
	}

	type answer struct {
		cs  externalcache.ChangeSet
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		cs, err := s.Changes(ctx, "payments", first.Revision)
		answered <- answer{cs, err}
	}()
	deadline := time.Now().Add(time.Minute)
	for watcherCount(t, srv.Endpoint()) == 0 { // the poll's own, or the shared one
		if time.Now().After(deadline) {
			t.Fatal("the poll's watch never reached etcd")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := proxy.Cut(); n == 0 {
		t.Fatal("no connection to cut")
	}
	rev := put(t, direct, "payments/limit", "200")
	a := <-answered
	if errors.Is(a.err, externalcache.ErrRejected) {
		t.Fatalf("the poll cut mid-stream was refused: %v", a.err)
	}
	since := first.Revision
	if a.err == nil {
		for _, ch := range a.cs.Changes {
			if ch.Name == "limit" && ch.Revision == rev {
				return // resumed by the client under the same poll
			}
		}
		since = a.cs.Revision
	}
	pollUntil(t, s, "payments", since, "limit", rev)
}

// watcherCount reads etcd's own count of its watchers from its /metrics.
func watcherCount(t *testing.T, endpoint string) int {
	t.Helper()
	resp, err := http.Get(endpoint + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watcher_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	t.Fatal("etcd's /metrics has no etcd_debugging_mvcc_watcher_total")
	return 0
}

// TestCertificates: an etcd that serves over TLS and demands client
// certificates. A client with a certificate of etcd's CA reads; one with an
// expired certificate, one of another CA, and one that does not trust the
// server are not served, with an error the cache retries that names the
// certificate where the client can know it. A client
// whose certificate file is renewed in place (a Secret's rotation) reads
// with the new one, without a new client.
func TestCertificates(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an etcd process")
	}
	dir := t.TempDir()
	ca, other := newAuthority(t, dir, "etcd"), newAuthority(t, dir, "other")
	now := time.Now()
	serverCert, serverKey := ca.issue(t, dir, "server", now.Add(24*time.Hour))
	adminCert, adminKey := ca.issue(t, dir, "admin", now.Add(24*time.Hour))
	ctx := context.Background()
	srv, err := configetcd.Start(ctx, configetcd.Options{Dir: filepath.Join(dir, "etcd"), TLS: &configetcd.TLS{
		CAFile: ca.file, CertFile: serverCert, KeyFile: serverKey, ClientCertFile: adminCert, ClientKeyFile: adminKey}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	admin, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	rev := put(t, admin, "payments/limit", "100")

	validCert, validKey := ca.issue(t, dir, "kshard", now.Add(24*time.Hour))
	expiredCert, expiredKey := ca.issue(t, dir, "kshard-expired", now.Add(-time.Hour))
	foreignCert, foreignKey := other.issue(t, dir, "kshard-foreign", now.Add(24*time.Hour))
	fetch := func(o etcdsource.ClientOptions) (externalcache.Value, error) {
		o.Servers, o.DialTimeout = []string{srv.Endpoint()}, 2*time.Second
		c, err := etcdsource.NewClient(o)
		if err != nil {
			return externalcache.Value{}, err
		}
		defer c.Close()
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return newSource(t, c, time.Second).Fetch(fctx, externalcache.Key{Domain: "payments", Name: "limit"})
	}
	if v, err := fetch(etcdsource.ClientOptions{CAFile: ca.file, CertFile: validCert, KeyFile: validKey}); err != nil || string(v.Data) != "100" || v.Revision != rev {
		t.Fatalf("with a valid certificate: %q at %d, %v; want 100 at %d", v.Data, v.Revision, err, rev)
	}
	for _, tc := range []struct {
		name string
		opts etcdsource.ClientOptions
		// named: the client knows the cause itself. Of a certificate the
		// server refuses it learns only from an alert that may arrive
		// after its first write failed (a broken pipe).
		named bool
	}{
		{"an expired client certificate", etcdsource.ClientOptions{CAFile: ca.file, CertFile: expiredCert, KeyFile: expiredKey}, true},
		{"a client certificate of another CA", etcdsource.ClientOptions{CAFile: ca.file, CertFile: foreignCert, KeyFile: foreignKey}, false},
		{"a server the client does not trust", etcdsource.ClientOptions{CAFile: other.file, CertFile: validCert, KeyFile: validKey}, true},
	} {
		v, err := fetch(tc.opts)
		switch {
		case err == nil:
			t.Errorf("%s: served %q", tc.name, v.Data)
		case errors.Is(err, externalcache.ErrRejected):
			t.Errorf("%s: %v, want a failure the cache retries (a renewed certificate heals it)", tc.name, err)
		case tc.named && !strings.Contains(err.Error(), "certificate"):
			t.Errorf("%s: %v, want an error that names the certificate", tc.name, err)
		default:
			t.Logf("%s: %v", tc.name, err)
		}
	}

	// Rotation: the mounted files hold an expired certificate, then a
	// renewed one.
	rotCert, rotKey := filepath.Join(dir, "mounted.crt"), filepath.Join(dir, "mounted.key")
	copyFile(t, expiredCert, rotCert)
	copyFile(t, expiredKey, rotKey)
	c, err := etcdsource.NewClient(etcdsource.ClientOptions{Servers: []string{srv.Endpoint()}, CAFile: ca.file, CertFile: rotCert, KeyFile: rotKey, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("a client on an expired certificate: %v", err)
	}
	defer c.Close()
	s := newSource(t, c, time.Second)
	fetchRotated := func() (externalcache.Value, error) {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return s.Fetch(fctx, externalcache.Key{Domain: "payments", Name: "limit"})
	}
	if v, err := fetchRotated(); err == nil {
		t.Fatalf("served %q on the expired certificate", v.Data)
	}
	copyFile(t, validCert, rotCert)
	copyFile(t, validKey, rotKey)
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := fetchRotated()
		if err == nil && string(v.Data) == "100" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the renewed certificate was not used: %q, %v", v.Data, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(to+".tmp", to); err != nil {
		t.Fatal(fmt.Errorf("renewing %s: %w", to, err))
	}
}
