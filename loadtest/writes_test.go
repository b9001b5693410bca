package loadtest

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// apiScrape parses an API server /metrics text into a sample taken at.
func apiScrape(t *testing.T, at time.Time, text string) apiServerSample {
	t.Helper()
	f, err := parseFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	s, err := apiSampleOf(f)
	if err != nil {
		t.Fatal(err)
	}
	s.At = at
	return s
}

const requestsHelp = "# HELP apiserver_request_total Counter of apiserver requests.\n# TYPE apiserver_request_total counter\n"

func TestControllerWritesPerUpdate(t *testing.T) {
	t0 := time.Now()
	before := apiScrape(t, t0, requestsHelp+`apiserver_request_total{code="201",resource="configbindings",subresource="",verb="POST"} 100
apiserver_request_total{code="200",resource="configbindings",subresource="",verb="PATCH"} 10
apiserver_request_total{code="200",resource="configbindings",subresource="status",verb="PATCH"} 100
apiserver_request_total{code="200",resource="configmaps",subresource="",verb="APPLY"} 100
apiserver_request_total{code="200",resource="configbindings",scope="cluster",subresource="",verb="LIST"} 3
apiserver_request_total{code="200",resource="configbindings",subresource="",verb="WATCH"} 3
apiserver_request_total{code="200",resource="leases",subresource="",verb="PUT"} 500
apiserver_request_total{code="201",resource="events",subresource="",verb="POST"} 40
`)
	// In the phase: the load tester's 50 spec patches; the controller's 50
	// status patches, 5 more that conflicted (409 counts: the server did
	// the work), 50 ConfigMap applies and one ConfigMap delete. Reads,
	// Lease renewals and Events are not object writes.
	after := apiScrape(t, t0.Add(time.Minute), requestsHelp+`apiserver_request_total{code="201",resource="configbindings",subresource="",verb="POST"} 100
apiserver_request_total{code="200",resource="configbindings",subresource="",verb="PATCH"} 60
apiserver_request_total{code="200",resource="configbindings",subresource="status",verb="PATCH"} 150
apiserver_request_total{code="409",resource="configbindings",subresource="status",verb="PATCH"} 5
apiserver_request_total{code="200",resource="configmaps",subresource="",verb="APPLY"} 150
apiserver_request_total{code="200",resource="configmaps",subresource="",verb="DELETE"} 1
apiserver_request_total{code="200",resource="configbindings",scope="cluster",subresource="",verb="LIST"} 5
apiserver_request_total{code="200",resource="configbindings",subresource="",verb="WATCH"} 9
apiserver_request_total{code="200",resource="leases",subresource="",verb="PUT"} 600
apiserver_request_total{code="201",resource="events",subresource="",verb="POST"} 47
`)
	if got := after.minus(before).ObjectWrites; got != 156 {
		t.Errorf("object writes in the phase = %v, want 156 (50 spec + 55 status + 50 apply + 1 delete)", got)
	}
	if d := after.minus(before); d.LeaseWrites != 100 || d.Writes != 263 {
		t.Errorf("lease writes %v, all writes %v; want 100 and 263", d.LeaseWrites, d.Writes)
	}

	from, to := writeMark{api: before, own: 7}, writeMark{api: after, own: 57}
	writes, own, ok := controllerWrites(from, to)
	if !ok || own != 50 || writes != 106 {
		t.Fatalf("controllerWrites = %v, %v, %v; want 106 by the replicas, 50 own", writes, own, ok)
	}
	if got := perCause(writes, ok, 50); got != 2.12 {
		t.Errorf("writes per spec update = %v, want 2.12", got)
	}
	if got := perCause(writes, ok, 0); got != -1 {
		t.Errorf("writes per spec update without updates = %v, want -1 (n/a)", got)
	}

	// A handover that rewrites nothing: the counts do not move.
	if writes, _, ok := controllerWrites(to, writeMark{api: after, own: 57}); !ok || perCause(writes, ok, 3333) != 0 {
		t.Errorf("an event without writes: %v writes (%v)", writes, ok)
	}
	// Without a mark at one edge nothing is counted, rather than every
	// write since the API server started.
	if _, _, ok := controllerWrites(writeMark{}, to); ok {
		t.Error("controllerWrites counted from a mark never taken")
	}
	// The load tester's writes that never reached the server do not make
	// the replicas' negative.
	if writes, _, _ := controllerWrites(from, writeMark{api: after, own: 1000}); writes != 0 {
		t.Errorf("controllerWrites = %v, want 0", writes)
	}
}

// An API server that restarted between two scrapes started its counters
// over: their difference is no count (a chaos run's fleet read -12 initial
// syncs and -16192 objects scanned before this), whether the server
// exports its process start or only its counts went down.
func TestCountsAcrossAnAPIServerRestart(t *testing.T) {
	t0 := time.Now()
	const started = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %d\n"
	scrape := func(at time.Time, start, lists, puts int) apiServerSample {
		text := requestsHelp + fmt.Sprintf(`apiserver_request_total{code="200",resource="configbindings",scope="cluster",subresource="",verb="LIST"} %d
apiserver_request_total{code="200",resource="configmaps",subresource="",verb="APPLY"} %d
`, lists, puts)
		if start > 0 {
			text += fmt.Sprintf(started, start)
		}
		return apiScrape(t, at, text)
	}
	before := scrape(t0, 1000, 12, 500)
	for _, c := range []struct {
		name  string
		after apiServerSample
		same  bool
	}{
		{"the same process", scrape(t0.Add(time.Minute), 1000, 14, 700), true},
		{"a new process, counts above the old ones", scrape(t0.Add(time.Minute), 1030, 14, 700), false},
		{"a new process, counts below", scrape(t0.Add(time.Minute), 1030, 2, 40), false},
		{"no process start, counts below", scrape(t0.Add(time.Minute), 0, 2, 40), false},
	} {
		before := before
		if c.after.Started == 0 {
			before.Started = 0
		}
		if got := c.after.sameServer(before); got != c.same {
			t.Errorf("%s: sameServer = %v, want %v", c.name, got, c.same)
		}
		if _, _, ok := controllerWrites(writeMark{api: before}, writeMark{api: c.after}); ok != c.same {
			t.Errorf("%s: controllerWrites counted = %v, want %v", c.name, ok, c.same)
		}
	}
}

func TestResourceOfPath(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/namespaces/loadtest/configmaps/cb-1-config":                              "configmaps",
		"/api/v1/namespaces/loadtest/configmaps":                                          "configmaps",
		"/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings/cb-1/status": "configbindings",
		"/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings":             "configbindings",
		"/api/v1/namespaces/loadtest":                                                     "namespaces",
		"/apis/apps/v1/namespaces/kshard-loadtest/statefulsets/kshard":                    "statefulsets",
		"/apis/coordination.k8s.io/v1/namespaces/kshard-loadtest/leases/shard-1":          "leases",
		"/k8s/clusters/c-1/apis/config.kshard.dev/v1alpha1/namespaces/x/configbindings/y": "configbindings",
		"/apis/config.kshard.dev/v1alpha1/externaldomains/domain-1":                       "externaldomains",
		"/metrics": "",
		"/api/v1":  "",
	} {
		if got := resourceOfPath(path); got != want {
			t.Errorf("resourceOfPath(%q) = %q, want %q", path, got, want)
		}
	}
}

type nopTransport struct{}

func (nopTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

func TestWriteCounter(t *testing.T) {
	var n atomic.Int64
	c := &http.Client{Transport: &writeCounter{next: nopTransport{}, n: &n}}
	const base = "http://127.0.0.1:6443"
	for _, r := range []struct{ method, path string }{
		{http.MethodPatch, "/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings/cb-1"},      // counted
		{http.MethodPost, "/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings"},            // counted
		{http.MethodDelete, "/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings/cb-2"},     // counted
		{http.MethodPatch, "/api/v1/namespaces/loadtest/configmaps/cb-1-config"},                            // counted
		{http.MethodGet, "/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings?watch=true"},  // a read
		{http.MethodGet, "/api/v1/namespaces/loadtest/configmaps"},                                          // a read
		{http.MethodPut, "/apis/apps/v1/namespaces/kshard-loadtest/statefulsets/kshard"},                    // not an object
		{http.MethodPost, "/api/v1/namespaces"},                                                             // not an object
		{http.MethodPatch, "/apis/coordination.k8s.io/v1/namespaces/kshard-loadtest/leases/kshard-shard-1"}, // not an object
	} {
		req, err := http.NewRequest(r.method, base+r.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := n.Load(); got != 4 {
		t.Errorf("counted %d object writes, want 4", got)
	}
}

func TestScannedLeavesOutConsistencyChecks(t *testing.T) {
	scrape := func(at time.Time, initEvents, cacheFetched, etcdFetched, checks int) apiServerSample {
		return apiScrape(t, at, requestsHelp+fmt.Sprintf(`apiserver_request_total{code="200",resource="configbindings",scope="cluster",subresource="",verb="LIST"} 2
apiserver_init_events_total{group="config.kshard.dev",resource="configbindings"} %d
apiserver_storage_list_fetched_objects_total{group="config.kshard.dev",index="",resource="configbindings",storage="watchcache"} %d
apiserver_storage_list_fetched_objects_total{group="config.kshard.dev",index="",resource="configbindings",storage="etcd"} %d
apiserver_storage_consistency_checks_total{group="config.kshard.dev",resource="configbindings",status="success"} %d
apiserver_storage_consistency_checks_total{group="config.kshard.dev",resource="configbindings",status="error"} 7
apiserver_storage_consistency_checks_total{group="",resource="configmaps",status="success"} 9
apiserver_resource_objects{group="config.kshard.dev",resource="configbindings"} 1000
apiserver_resource_objects{group="",resource="configmaps"} 1000
`, initEvents, cacheFetched, etcdFetched, checks))
	}
	t0 := time.Now()
	before := scrape(t0, 5000, 1256, 1000, 1)
	after := scrape(t0.Add(time.Minute), 6000, 2256, 2000, 2)
	if got := after.minus(before).Scanned; got != 1000 {
		t.Errorf("ConfigBindings scanned = %v, want 1000 (one watch-list; the check's 2,000 left out)", got)
	}
	// The check's cache list was counted before the first scrape, its etcd
	// list and its end after.
	straddled := scrape(t0, 5000, 2256, 1000, 1)
	if got := after.minus(straddled).Scanned; got != 1000 {
		t.Errorf("ConfigBindings scanned across a check's start = %v, want 1000", got)
	}
}
