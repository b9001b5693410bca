package loadtest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/childproc"
)

// exposition serves a /metrics text the test changes between scrapes,
// or, while down, fails every scrape.
type exposition struct {
	mu   sync.Mutex
	text string
	down bool
}

func (e *exposition) setDown(down bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.down = down
}

func (e *exposition) set(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.text = fmt.Sprintf(format, args...)
}

func (e *exposition) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = w.Write([]byte(e.text))
}

// TestQueriesCountWhatTheServerServed runs the report's queries through a
// real Prometheus over an API server and a load tester whose counters the
// test sets: a phase in which the API server served 100 ConfigMap applies,
// 50 status patches and the load tester's own 30 spec patches (and 200
// Lease renewals) must read 150 controller writes for 30 spec updates,
// 5.00 per update, however the counters stood before the phase. Forgetting
// to subtract the load tester's own writes reads 6.00; counting Leases or
// the counts before the phase reads more still. A second phase whose
// server is scraped only well after the phase's end (its scrapes fail
// until then, as they come late on a loaded machine) must read the same:
// the phase's end is read at the first scrape after it, not one interval
// after it.
func TestQueriesCountWhatTheServerServed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus")
	}
	api, tester := &exposition{}, &exposition{}
	apiText := "# TYPE apiserver_request_total counter\n" +
		"apiserver_request_total{resource=\"configmaps\",subresource=\"\",verb=\"APPLY\",code=\"200\"} %d\n" +
		"apiserver_request_total{resource=\"configbindings\",subresource=\"status\",verb=\"PATCH\",code=\"200\"} %d\n" +
		"apiserver_request_total{resource=\"configbindings\",subresource=\"\",verb=\"PATCH\",code=\"200\"} %d\n" +
		"apiserver_request_total{resource=\"leases\",subresource=\"\",verb=\"PUT\",code=\"200\"} %d\n"
	testerText := "# TYPE loadtest_object_writes_total counter\nloadtest_object_writes_total %d\n" +
		"# TYPE loadtest_writes_sent_total counter\nloadtest_writes_sent_total{fleet=\"fleet-1\",kind=\"update\"} %d\n"
	// Before the phase: counts the phase must not take in.
	api.set(apiText, 1000, 700, 400, 5000)
	tester.set(testerText, 400, 400)
	apiSrv, testerSrv := httptest.NewServer(api), httptest.NewServer(tester)
	defer apiSrv.Close()
	defer testerSrv.Close()

	procs := childproc.NewSupervisor(func(err error) { t.Errorf("Prometheus exited: %v", err) })
	defer procs.StopAll(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	p, err := startPrometheus(ctx, procs, promOptions{dir: t.TempDir(), interval: 200 * time.Millisecond,
		apiServer: promScrape{addr: host(apiSrv)}, tester: promScrape{addr: host(testerSrv)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.caughtUp(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	qs, err := loadQueries()
	if err != nil {
		t.Fatal(err)
	}
	const name = "controller API writes per spec update (ConfigBindings and ConfigMaps, the load tester's own subtracted)"
	var q []query
	for _, x := range qs.Rows {
		if x.Name == name {
			q = append(q, x)
		}
	}
	if len(q) != 1 {
		t.Fatalf("no query %q", name)
	}
	for i, late := range []bool{false, true} {
		from, err := p.spanStart(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The phase: 100 applies, 50 status patches, 30 spec patches (the
		// load tester's), 200 Lease renewals (not object writes).
		api.set(apiText, 1000+(i+1)*100, 700+(i+1)*50, 400+(i+1)*30, 5000+(i+1)*200)
		tester.set(testerText, 400+(i+1)*30, 400+(i+1)*30)
		api.setDown(late)
		time.Sleep(time.Second) // a few scrapes of the phase's counts, or failures
		to := time.Now()
		if late {
			time.Sleep(time.Second) // failures past the end's interval
			api.setDown(false)
		}
		if err := p.caughtUp(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		w := queryWindow{fleet: "fleet-1", step: 200 * time.Millisecond, spans: map[string]span{"phase": {from: from, to: to}}}
		got := p.figures(ctx, q, w)[0]
		if got.NoData != "" || got.Value != 5 {
			t.Errorf("scraped late %v: %s = %v (%s), want 5: 150 controller writes for 30 spec updates\n%s", late, name, got.Value, got.NoData, got.Query)
		}
		if err := p.caughtUp(ctx, time.Now()); err != nil { // the quiet before the next phase
			t.Fatal(err)
		}
	}
}
