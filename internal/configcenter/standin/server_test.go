package standin

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/configcenter"
)

// startServer runs a server on a loopback port for the duration of the test.
func startServer(t *testing.T, opts Options) *Server {
	t.Helper()
	srv, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("starting the config center: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("closing the config center: %v", err)
		}
	})
	return srv
}

func newClient(t *testing.T, srv *Server, mutate func(*configcenter.ClientOptions)) *configcenter.Client {
	t.Helper()
	o := configcenter.ClientOptions{BaseURL: srv.URL(), Caller: "test"}
	if mutate != nil {
		mutate(&o)
	}
	c, err := configcenter.NewClient(o)
	if err != nil {
		t.Fatalf("creating the client: %v", err)
	}
	return c
}

// rawRequest sends a request exactly as given (the path is not cleaned) and returns the status,
// headers and body.
func rawRequest(t *testing.T, method, url string, body io.Reader, header http.Header) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatalf("building %s %s: %v", method, url, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatalf("reading the answer to %s %s: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header, data
}

// assertJSONError checks that an answer is a JSON error body with a message.
func assertJSONError(t *testing.T, what string, header http.Header, body []byte) {
	t.Helper()
	if ct := header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q, want application/json", what, ct)
	}
	var e configcenter.ErrorBody
	if err := configcenter.DecodeStrict(bytes.NewReader(body), 1<<20, &e); err != nil || e.Error == "" {
		t.Errorf("%s: body %q is not a JSON error: %v", what, body, err)
	}
}

func TestBadRequestsAnswer4xxWithJSONErrors(t *testing.T) {
	srv := startServer(t, Options{Seed: configcenter.SeedOptions{Domains: 1, KeysPerDomain: 1, ValueBytes: 8}})
	base := srv.URL()
	long := strings.Repeat("a", configcenter.MaxNameLength+1)
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"unknown domain", "GET", "/v1/domains/nope/keys/key-0", "", 404},
		{"unknown key", "GET", "/v1/domains/domain-0/keys/nope", "", 404},
		{"domain not a DNS label", "GET", "/v1/domains/Bad_Domain/keys/key-0", "", 400},
		{"domain too long", "GET", "/v1/domains/" + long + "/keys/key-0", "", 400},
		{"key with dot-dot", "GET", "/v1/domains/domain-0/keys/a..b", "", 400},
		{"key too long", "GET", "/v1/domains/domain-0/keys/" + long, "", 400},
		{"key with escaped slash", "GET", "/v1/domains/domain-0/keys/a%2Fb", "", 400},
		{"key with escaped dot-dot", "GET", "/v1/domains/domain-0/keys/%2e%2e", "", 400},
		{"key starting with a dot", "GET", "/v1/domains/domain-0/keys/.hidden", "", 400},
		{"dot-dot segment", "GET", "/v1/domains/domain-0/keys/../key-0", "", 400},
		{"double slash", "GET", "/v1/domains//domain-0/keys/key-0", "", 400},
		{"extra segment", "GET", "/v1/domains/domain-0/keys/key-0/more", "", 404},
		{"unknown route", "GET", "/v2/anything", "", 404},
		{"method not allowed on a key", "PATCH", "/v1/domains/domain-0/keys/key-0", "", 405},
		{"bad JSON", "PUT", "/v1/domains/domain-0/keys/key-0", `{"value":`, 400},
		{"unknown field", "PUT", "/v1/domains/domain-0/keys/key-0", `{"value":"v","extra":1}`, 400},
		{"missing value", "PUT", "/v1/domains/domain-0/keys/key-0", `{}`, 400},
		{"value not a string", "PUT", "/v1/domains/domain-0/keys/key-0", `{"value":42}`, 400},
		{"trailing data", "PUT", "/v1/domains/domain-0/keys/key-0", `{"value":"v"} {"value":"w"}`, 400},
		{"oversized body", "PUT", "/v1/domains/domain-0/keys/key-0", `{"value":"` + strings.Repeat("x", MaxBodyBytes) + `"}`, 413},
		{"negative since", "GET", "/v1/domains/domain-0/changes?since=-1", "", 400},
		{"since not a number", "GET", "/v1/domains/domain-0/changes?since=abc", "", 400},
		{"bad timeout", "GET", "/v1/domains/domain-0/changes?timeout=soon", "", 400},
		{"negative timeout", "GET", "/v1/domains/domain-0/changes?timeout=-1s", "", 400},
		{"changes of a bad domain", "GET", "/v1/domains/BAD/changes", "", 400},
		{"POST to changes", "POST", "/v1/domains/domain-0/changes", "", 405},
		{"negative seed", "POST", "/admin/seed", `{"domains":-1}`, 400},
		{"huge seed", "POST", "/admin/seed", `{"domains":100000,"keysPerDomain":100000,"valueBytes":1}`, 400},
		{"GET seed", "GET", "/admin/seed", "", 405},
		{"error rate above 1", "PUT", "/admin/faults", `{"errorRate":2}`, 400},
		{"latency not a duration", "PUT", "/admin/faults", `{"latency":5}`, 400},
		{"DELETE faults", "DELETE", "/admin/faults", "", 405},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			code, header, data := rawRequest(t, tc.method, base+tc.path, body, nil)
			if code != tc.want {
				t.Errorf("%s %s answered %d %q, want %d", tc.method, tc.path, code, data, tc.want)
			}
			assertJSONError(t, tc.name, header, data)
		})
	}
	// Nothing above changed the data or broke the server.
	v, err := newClient(t, srv, nil).Get(context.Background(), "domain-0", "key-0")
	if err != nil || v.Value != configcenter.SeedValue("domain-0", "key-0", 8) || v.Revision != 1 {
		t.Errorf("after bad requests: Get = %+v, %v; want the seeded value at revision 1", v, err)
	}
}

func TestKeysHaveRevisionsAndDeletesAreReported(t *testing.T) {
	srv := startServer(t, Options{})
	c := newClient(t, srv, nil)
	ctx := context.Background()

	if _, err := c.Get(ctx, "shop", "price"); !errors.Is(err, configcenter.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	v1, err := c.Put(ctx, "shop", "price", "10")
	if err != nil {
		t.Fatal(err)
	}
	v2, err := c.Put(ctx, "shop", "price", "11")
	if err != nil {
		t.Fatal(err)
	}
	if v2.Revision <= v1.Revision {
		t.Errorf("revision did not increase: %d then %d", v1.Revision, v2.Revision)
	}
	got, err := c.Get(ctx, "shop", "price")
	if err != nil || got != v2 {
		t.Errorf("Get = %+v, %v; want %+v", got, err, v2)
	}
	rev, err := c.Delete(ctx, "shop", "price")
	if err != nil || rev <= v2.Revision {
		t.Fatalf("Delete = %d, %v; want a revision above %d", rev, err, v2.Revision)
	}
	if _, err := c.Get(ctx, "shop", "price"); !errors.Is(err, configcenter.ErrNotFound) {
		t.Errorf("Get after Delete: %v, want ErrNotFound", err)
	}
	if _, err := c.Delete(ctx, "shop", "price"); !errors.Is(err, configcenter.ErrNotFound) {
		t.Errorf("second Delete: %v, want ErrNotFound", err)
	}
	cs, err := c.Changes(ctx, "shop", v2.Revision)
	if err != nil {
		t.Fatal(err)
	}
	want := []configcenter.Change{{Key: "price", Revision: rev, Deleted: true}}
	if len(cs.Changes) != 1 || cs.Changes[0] != want[0] || cs.Revision != rev {
		t.Errorf("Changes = %+v, want revision %d and %+v", cs, rev, want)
	}
}

func TestChangesReturnAtOnceWhenNewer(t *testing.T) {
	srv := startServer(t, Options{})
	c := newClient(t, srv, nil) // default poll timeout 25s: a wait would show as a hang, not a pass
	ctx := context.Background()
	a, _ := srv.Put("shop", "a", "1")
	b, _ := srv.Put("shop", "b", "1")
	cs, err := c.Changes(ctx, "shop", a.Revision-1)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Changes) != 2 || cs.Changes[0].Key != "a" || cs.Changes[1].Key != "b" || cs.Revision != b.Revision {
		t.Errorf("Changes = %+v, want a then b up to revision %d", cs, b.Revision)
	}
}

func TestChangesWaitForAChange(t *testing.T) {
	srv := startServer(t, Options{})
	c := newClient(t, srv, nil)
	ctx := context.Background()
	base, _ := srv.Put("shop", "a", "1")
	srv.Put("other", "x", "1") // changes elsewhere do not answer the poll

	done := make(chan configcenter.ChangeSet, 1)
	errs := make(chan error, 1)
	go func() {
		cs, err := c.Changes(ctx, "shop", base.Revision+1)
		errs <- err
		done <- cs
	}()
	// Wait until the server has seen the poll, so that the PUT below lands while it waits.
	waitFor(t, func() bool { return srv.waiting.Load() == 1 })
	v, _ := srv.Put("shop", "b", "2")
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	cs := <-done
	if len(cs.Changes) != 1 || cs.Changes[0] != (configcenter.Change{Key: "b", Revision: v.Revision}) {
		t.Errorf("Changes = %+v, want only b at revision %d", cs, v.Revision)
	}
}

func TestChangesTimeOutWithNoChanges(t *testing.T) {
	srv := startServer(t, Options{})
	c := newClient(t, srv, func(o *configcenter.ClientOptions) { o.PollTimeout = 50 * time.Millisecond })
	v, _ := srv.Put("shop", "a", "1")
	cs, err := c.Changes(context.Background(), "shop", v.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Changes) != 0 || cs.Revision != v.Revision {
		t.Errorf("Changes = %+v, want none at revision %d", cs, v.Revision)
	}
	// A domain that does not exist yet waits too, and answers with the current revision.
	cs, err = c.Changes(context.Background(), "later", 0)
	if err != nil || len(cs.Changes) != 0 || cs.Revision != v.Revision {
		t.Errorf("Changes of an unknown domain = %+v, %v; want none at revision %d", cs, err, v.Revision)
	}
}

func TestChangesArePagedAndRestartsAreVisible(t *testing.T) {
	srv := startServer(t, Options{MaxChanges: 2})
	c := newClient(t, srv, nil)
	ctx := context.Background()
	var last configcenter.Value
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		last, _ = srv.Put("shop", k, "v")
	}
	var keys []string
	since := int64(0)
	for since < last.Revision {
		cs, err := c.Changes(ctx, "shop", since)
		if err != nil {
			t.Fatal(err)
		}
		if len(cs.Changes) == 0 || len(cs.Changes) > 2 {
			t.Fatalf("page since %d has %d changes, want 1..2", since, len(cs.Changes))
		}
		for _, ch := range cs.Changes {
			keys = append(keys, ch.Key)
		}
		since = cs.Revision
	}
	if strings.Join(keys, ",") != "a,b,c,d,e" {
		t.Errorf("paged keys = %v, want a..e in order", keys)
	}
	// Every answer of one server names the same history; another server names another.
	first, _ := c.Changes(ctx, "shop", 0)
	other := startServer(t, Options{})
	otherCS, err := newClient(t, other, nil).Changes(ctx, "shop", 1)
	if err != nil || first.Epoch == "" || otherCS.Epoch == "" || otherCS.Epoch == first.Epoch {
		t.Errorf("epochs %q and %q (%v), want two different non-empty ones", first.Epoch, otherCS.Epoch, err)
	}
	if again, _ := c.Changes(ctx, "shop", 0); again.Epoch != first.Epoch {
		t.Errorf("epoch changed from %q to %q without a restart", first.Epoch, again.Epoch)
	}
	// A client that knows a future revision learns at once that the server lost its history.
	cs, err := c.Changes(ctx, "shop", last.Revision+100)
	if err != nil || cs.Revision >= last.Revision+100 {
		t.Errorf("Changes from the future = %+v, %v; want a lower revision at once", cs, err)
	}
}

func TestCloseEndsWaitingPolls(t *testing.T) {
	srv, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, srv, nil)
	v, _ := srv.Put("shop", "a", "1")
	errs := make(chan error, 1)
	go func() {
		_, err := c.Changes(context.Background(), "shop", v.Revision)
		errs <- err
	}()
	waitFor(t, func() bool { return srv.waiting.Load() == 1 })
	if err := srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	<-errs // returns (with whatever error) instead of hanging for the poll timeout
}

func TestFaultsAreInjectedIntoDataRoutesOnly(t *testing.T) {
	srv := startServer(t, Options{Seed: configcenter.SeedOptions{Domains: 1, KeysPerDomain: 1}})
	c := newClient(t, srv, nil)
	ctx := context.Background()

	var se *configcenter.StatusError
	if err := c.SetFaults(ctx, configcenter.Faults{Outage: true, RetryAfter: configcenter.Duration{Duration: 3 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "domain-0", "key-0"); !errors.As(err, &se) || se.Code != 503 || se.RetryAfter != 3*time.Second {
		t.Errorf("Get during an outage: %v, want 503 with Retry-After 3s", err)
	}
	if _, err := c.Changes(ctx, "domain-0", 0); !errors.As(err, &se) || se.Code != 503 {
		t.Errorf("Changes during an outage: %v, want 503", err)
	}
	if f, err := c.Faults(ctx); err != nil || !f.Outage {
		t.Errorf("admin routes during an outage: %+v, %v; want the faults", f, err)
	}
	if code, _, _ := rawRequest(t, "GET", srv.URL()+"/metrics", nil, nil); code != 200 {
		t.Errorf("/metrics during an outage answered %d", code)
	}

	if err := c.SetFaults(ctx, configcenter.Faults{ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "domain-0", "key-0"); !errors.As(err, &se) || se.Code != 500 {
		t.Errorf("Get with error rate 1: %v, want 500", err)
	}

	if err := c.SetFaults(ctx, configcenter.Faults{RateLimit: 0.01, RateBurst: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "domain-0", "key-0"); err != nil {
		t.Errorf("first Get under the rate limit: %v", err)
	}
	if _, err := c.Get(ctx, "domain-0", "key-0"); !errors.As(err, &se) || se.Code != 429 || se.RetryAfter < time.Second {
		t.Errorf("second Get under the rate limit: %v, want 429 with a Retry-After of at least 1s", err)
	}

	const latency = 30 * time.Millisecond
	if err := c.SetFaults(ctx, configcenter.Faults{Latency: configcenter.Duration{Duration: latency}, Jitter: configcenter.Duration{Duration: 10 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	srv.ResetStats()
	if _, err := c.Get(ctx, "domain-0", "key-0"); err != nil {
		t.Fatal(err)
	}
	recs := srv.Requests(func(r configcenter.RequestRecord) bool { return r.Route == configcenter.RouteGetKey })
	if len(recs) != 1 || recs[0].Done.Sub(recs[0].Arrived) < latency {
		t.Errorf("requests with injected latency: %+v, want one answered at least %s after it arrived", recs, latency)
	}

	if err := c.SetFaults(ctx, configcenter.Faults{ErrorRate: -1}); err == nil {
		t.Error("SetFaults accepted a negative error rate")
	}
	if err := c.SetFaults(ctx, configcenter.Faults{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "domain-0", "key-0"); err != nil {
		t.Errorf("Get after clearing faults: %v", err)
	}
}

// TestFeedFaultsBreakTheChangeFeed: ShortPolls answers a poll at once with nothing changed
// although a change waits, FailPolls fails polls only, and AlternateEpochs answers every other
// poll of a domain from another history, with the same changes.
func TestFeedFaultsBreakTheChangeFeed(t *testing.T) {
	srv := startServer(t, Options{Seed: configcenter.SeedOptions{Domains: 1, KeysPerDomain: 1}})
	c := newClient(t, srv, nil)
	ctx := context.Background()
	first, err := c.Changes(ctx, "domain-0", 0)
	if err != nil || len(first.Changes) != 1 {
		t.Fatalf("first poll: %+v, %v; want the seeded key", first, err)
	}
	v, err := srv.Put("domain-0", "key-0", "changed")
	if err != nil {
		t.Fatal(err)
	}

	if err := c.SetFaults(ctx, configcenter.Faults{ShortPolls: true}); err != nil {
		t.Fatal(err)
	}
	cs, err := c.Changes(ctx, "domain-0", first.Revision)
	if err != nil || len(cs.Changes) != 0 || cs.Revision != first.Revision || cs.Epoch != first.Epoch {
		t.Errorf("poll with ShortPolls: %+v, %v; want no changes at revision %d of epoch %s", cs, err, first.Revision, first.Epoch)
	}

	var se *configcenter.StatusError
	if err := c.SetFaults(ctx, configcenter.Faults{FailPolls: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Changes(ctx, "domain-0", first.Revision); !errors.As(err, &se) || se.Code != http.StatusGatewayTimeout {
		t.Errorf("poll with FailPolls: %v, want 504", err)
	}
	if _, err := c.Get(ctx, "domain-0", "key-0"); err != nil {
		t.Errorf("Get with FailPolls: %v, want the value", err)
	}

	if err := c.SetFaults(ctx, configcenter.Faults{AlternateEpochs: true}); err != nil {
		t.Fatal(err)
	}
	var epochs []string
	for range 4 {
		cs, err := c.Changes(ctx, "domain-0", first.Revision)
		if err != nil || len(cs.Changes) != 1 || cs.Changes[0].Revision != v.Revision {
			t.Fatalf("poll with AlternateEpochs: %+v, %v; want the change at revision %d", cs, err, v.Revision)
		}
		epochs = append(epochs, cs.Epoch)
	}
	if epochs[0] != first.Epoch || epochs[1] == first.Epoch || epochs[2] != first.Epoch || epochs[3] != epochs[1] {
		t.Errorf("epochs of four polls with AlternateEpochs: %v; want %s alternating with another", epochs, first.Epoch)
	}
}

func TestTokenIsRequiredExceptForMetricsAndHealth(t *testing.T) {
	srv := startServer(t, Options{Token: "s3cret", Seed: configcenter.SeedOptions{Domains: 1, KeysPerDomain: 1}})
	ctx := context.Background()
	for _, token := range []string{"", "wrong"} {
		var se *configcenter.StatusError
		_, err := newClient(t, srv, func(o *configcenter.ClientOptions) { o.Token = token }).Get(ctx, "domain-0", "key-0")
		if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
			t.Errorf("Get with token %q: %v, want 401", token, err)
		}
	}
	code, header, body := rawRequest(t, "GET", srv.URL()+"/admin/stats", nil, nil)
	if code != 401 || header.Get("WWW-Authenticate") == "" {
		t.Errorf("/admin/stats without a token answered %d %v", code, header)
	}
	assertJSONError(t, "401", header, body)
	if _, err := newClient(t, srv, func(o *configcenter.ClientOptions) { o.Token = "s3cret" }).Get(ctx, "domain-0", "key-0"); err != nil {
		t.Errorf("Get with the token: %v", err)
	}
	for _, path := range []string{"/metrics", "/healthz"} {
		if code, _, _ := rawRequest(t, "GET", srv.URL()+path, nil, nil); code != 200 {
			t.Errorf("%s without a token answered %d, want 200", path, code)
		}
	}
}

func TestStatsCountByCallerDomainRouteAndCode(t *testing.T) {
	srv := startServer(t, Options{Seed: configcenter.SeedOptions{Domains: 2, KeysPerDomain: 1}})
	ctx := context.Background()
	a := newClient(t, srv, func(o *configcenter.ClientOptions) { o.Caller = "replica-a" })
	b := newClient(t, srv, func(o *configcenter.ClientOptions) { o.Caller = "replica-b" })
	anon := newClient(t, srv, func(o *configcenter.ClientOptions) { o.Caller = "" })
	for range 3 {
		if _, err := a.Get(ctx, "domain-0", "key-0"); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := b.Get(ctx, "domain-1", "key-0"); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = b.Get(ctx, "domain-1", "missing")
	_, _ = anon.Get(ctx, "domain-0", "key-0")

	s, err := a.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		caller, domain, route string
		code                  int
		want                  int64
	}{
		{"replica-a", "domain-0", configcenter.RouteGetKey, 200, 3},
		{"replica-a", "", "", 0, 3},
		{"replica-b", "domain-1", configcenter.RouteGetKey, 200, 2},
		{"replica-b", "domain-1", configcenter.RouteGetKey, 404, 1},
		{"unknown", "domain-0", configcenter.RouteGetKey, 200, 1},
		{"", "", configcenter.RouteGetKey, 0, 7},
	}
	for _, c := range checks {
		if got := s.Count(c.caller, c.domain, c.route, c.code); got != c.want {
			t.Errorf("Count(%q, %q, %q, %d) = %d, want %d", c.caller, c.domain, c.route, c.code, got, c.want)
		}
	}
	if s.Routes[configcenter.RouteGetKey]["200"] != 6 || s.Routes[configcenter.RouteGetKey]["404"] != 1 {
		t.Errorf("per-route totals = %v, want 6 × 200 and 1 × 404", s.Routes[configcenter.RouteGetKey])
	}
	_, _, metrics := rawRequest(t, "GET", srv.URL()+"/metrics", nil, nil)
	want := `configcenter_requests_total{caller="replica-a",code="200",domain="domain-0",route="get_key"} 3`
	if !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics lacks %s", want)
	}
	if err := a.ResetStats(ctx); err != nil {
		t.Fatal(err)
	}
	if s := srv.Stats(); s.Total != 1 || s.Count("replica-a", "", configcenter.RouteAdmin, 200) != 1 {
		t.Errorf("after reset: %+v, want only the reset call itself, counted once it was answered", s)
	}
}

func TestSeedWritesPredictableData(t *testing.T) {
	srv := startServer(t, Options{Seed: configcenter.SeedOptions{Domains: 1, KeysPerDomain: 2, ValueBytes: 4}})
	c := newClient(t, srv, nil)
	ctx := context.Background()
	res, err := c.Seed(ctx, configcenter.SeedOptions{Domains: 3, KeysPerDomain: 5, ValueBytes: 40})
	if err != nil {
		t.Fatal(err)
	}
	if res.Keys != 15 || res.Revision != 2+15 {
		t.Errorf("Seed = %+v, want 15 keys up to revision 17", res)
	}
	v, err := c.Get(ctx, configcenter.SeedDomain(2), configcenter.SeedKey(4))
	if err != nil || v.Value != configcenter.SeedValue("domain-2", "key-4", 40) || len(v.Value) != 40 {
		t.Errorf("seeded value = %+v, %v", v, err)
	}
	if _, err := c.Seed(ctx, configcenter.SeedOptions{ValueBytes: 1<<20 + 1}); err == nil {
		t.Error("Seed accepted an oversized value")
	}
}

func TestConcurrentWritesKeepRevisionsUnique(t *testing.T) {
	srv := startServer(t, Options{})
	c := newClient(t, srv, nil)
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 10 {
				v, err := c.Put(context.Background(), "shop", configcenter.SeedKey(i), configcenter.SeedKey(j))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[v.Revision] {
					t.Errorf("revision %d handed out twice", v.Revision)
				}
				seen[v.Revision] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != 80 {
		t.Errorf("%d distinct revisions, want 80", len(seen))
	}
}

// waitFor polls cond with a generous bound; it is a way to wait, never a timing assertion.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOnlyTheServersNotFoundIsNotFound: a 404 from something in front of the
// config center (a misrouted proxy's page) is an error, never "this key does
// not exist", which the cache would remember; the server's own answer is.
// A 200 whose body is not a value is this key's fault (ErrInvalidAnswer).
func TestOnlyTheServersNotFoundIsNotFound(t *testing.T) {
	srv := startServer(t, Options{})
	c := newClient(t, srv, nil)
	if _, err := c.Get(context.Background(), "no-such-domain", "k"); !errors.Is(err, configcenter.ErrNotFound) {
		t.Fatalf("the server's own not-found: %v, want ErrNotFound", err)
	}
	var answer atomic.Value
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		a := answer.Load().([2]string)
		code, _ := strconv.Atoi(a[0])
		w.WriteHeader(code)
		_, _ = io.WriteString(w, a[1])
	}))
	t.Cleanup(proxy.Close)
	pc, err := configcenter.NewClient(configcenter.ClientOptions{BaseURL: proxy.URL})
	if err != nil {
		t.Fatal(err)
	}
	answer.Store([2]string{"404", "<html>Not Found</html>"})
	_, err = pc.Get(context.Background(), "d", "k")
	var se *configcenter.StatusError
	if errors.Is(err, configcenter.ErrNotFound) || !errors.As(err, &se) || se.Code != http.StatusNotFound {
		t.Errorf("a proxy's 404: %v, want a StatusError 404 that is not ErrNotFound", err)
	}
	answer.Store([2]string{"404", `{"error":"no route"}`})
	if _, err := pc.Get(context.Background(), "d", "k"); errors.Is(err, configcenter.ErrNotFound) {
		t.Errorf("a 404 without the not-found reason: %v, want not ErrNotFound", err)
	}
	answer.Store([2]string{"200", "garbage"})
	if _, err := pc.Get(context.Background(), "d", "k"); !errors.Is(err, configcenter.ErrInvalidAnswer) {
		t.Errorf("an unreadable 200: %v, want ErrInvalidAnswer", err)
	}
	src := configcenter.NewCacheSource(pc)
	if _, err := src.Fetch(context.Background(), externalcache.Key{Domain: "d", Name: "k"}); !errors.Is(err, externalcache.ErrInvalidValue) {
		t.Errorf("an unreadable 200 through the cache source: %v, want externalcache.ErrInvalidValue", err)
	}
}
