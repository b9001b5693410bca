package configcenter

import (
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// CallerHeader names the client on every request, so that the server can count calls per
// controller replica, load generator or test. A caller that is not a lower-case DNS label (or a
// key-like name) is counted as "invalid", and a missing one as "unknown", which keeps the metric's
// cardinality bounded.
const CallerHeader = "X-Kshard-Caller"

// Route names used as labels and in Stats.
const (
	RouteGetKey    = "get_key"
	RoutePutKey    = "put_key"
	RouteDeleteKey = "delete_key"
	RouteChanges   = "changes"
	RouteAdmin     = "admin"
	RouteUnknown   = "unknown"
)

// StatSeries is one counter of Stats: the requests with the same caller, domain, route and code.
type StatSeries struct {
	Caller string `json:"caller"`
	Domain string `json:"domain"`
	Route  string `json:"route"`
	Code   int    `json:"code"`
	Count  int64  `json:"count"`
}

// Stats summarises the requests the server answered since start or the last reset. It holds the
// same counts as /metrics in a form a test can assert on without parsing Prometheus text.
type Stats struct {
	Total int64 `json:"total"`
	// Routes is the count per route and status code (as a decimal string).
	Routes map[string]map[string]int64 `json:"routes"`
	// Series lists every caller/domain/route/code counter, sorted.
	Series []StatSeries `json:"series"`
}

// Count sums the series matching the filter; an empty string or a zero code matches anything.
func (s Stats) Count(caller, domain, route string, code int) int64 {
	var n int64
	for _, x := range s.Series {
		if (caller == "" || x.Caller == caller) && (domain == "" || x.Domain == domain) &&
			(route == "" || x.Route == route) && (code == 0 || x.Code == code) {
			n += x.Count
		}
	}
	return n
}

// RequestRecord is one answered request, kept in a bounded in-memory log so that tests can check
// the order and spacing of calls (for example that a client waited for Retry-After).
type RequestRecord struct {
	Arrived    time.Time     `json:"arrived"`
	Done       time.Time     `json:"done"`
	Caller     string        `json:"caller"`
	Method     string        `json:"method"`
	Route      string        `json:"route"`
	Domain     string        `json:"domain,omitempty"`
	Key        string        `json:"key,omitempty"`
	Code       int           `json:"code"`
	RetryAfter time.Duration `json:"retryAfter,omitempty"`
}

type seriesKey struct {
	caller, domain, route string
	code                  int
}

// recorder counts requests for Stats, for /metrics and in the request log.
type recorder struct {
	registry *prometheus.Registry
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec

	mu     sync.Mutex
	counts map[seriesKey]int64
	log    []RequestRecord
	next   int
	full   bool
}

func newRecorder(logSize int, st *store, waiting *atomic.Int64) *recorder {
	r := &recorder{
		registry: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "configcenter_requests_total",
			Help: "Requests answered by the config center, by caller (X-Kshard-Caller), domain, route and status code.",
		}, []string{"caller", "domain", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "configcenter_request_duration_seconds",
			Help:    "Time to answer a request, injected latency included, by route.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route"}),
		counts: map[seriesKey]int64{},
		log:    make([]RequestRecord, logSize),
	}
	keys := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "configcenter_keys",
		Help: "Live keys held by the config center.",
	}, func() float64 { _, n, _ := st.counts(); return float64(n) })
	revision := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "configcenter_revision",
		Help: "Current global revision of the config center.",
	}, func() float64 { _, _, rev := st.counts(); return float64(rev) })
	polls := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "configcenter_waiting_polls",
		Help: "Change-feed polls waiting for a change.",
	}, func() float64 { return float64(waiting.Load()) })
	r.registry.MustRegister(r.calls, r.duration, keys, revision, polls,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

func (r *recorder) record(rec RequestRecord) {
	r.calls.WithLabelValues(rec.Caller, rec.Domain, rec.Route, strconv.Itoa(rec.Code)).Inc()
	r.duration.WithLabelValues(rec.Route).Observe(rec.Done.Sub(rec.Arrived).Seconds())
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[seriesKey{rec.Caller, rec.Domain, rec.Route, rec.Code}]++
	if len(r.log) > 0 {
		r.log[r.next] = rec
		r.next = (r.next + 1) % len(r.log)
		r.full = r.full || r.next == 0
	}
}

func (r *recorder) stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Stats{Routes: map[string]map[string]int64{}, Series: make([]StatSeries, 0, len(r.counts))}
	for k, n := range r.counts {
		s.Total += n
		codes := s.Routes[k.route]
		if codes == nil {
			codes = map[string]int64{}
			s.Routes[k.route] = codes
		}
		codes[strconv.Itoa(k.code)] += n
		s.Series = append(s.Series, StatSeries{Caller: k.caller, Domain: k.domain, Route: k.route, Code: k.code, Count: n})
	}
	sort.Slice(s.Series, func(i, j int) bool {
		a, b := s.Series[i], s.Series[j]
		if a.Caller != b.Caller {
			return a.Caller < b.Caller
		}
		if a.Domain != b.Domain {
			return a.Domain < b.Domain
		}
		if a.Route != b.Route {
			return a.Route < b.Route
		}
		return a.Code < b.Code
	})
	return s
}

// reset clears Stats and the request log; Prometheus counters keep counting, as counters must.
func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts = map[seriesKey]int64{}
	clear(r.log)
	r.next, r.full = 0, false
}

// requests returns the logged requests matching the filter, oldest first.
func (r *recorder) requests(match func(RequestRecord) bool) []RequestRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ordered []RequestRecord
	if r.full {
		ordered = append(append(ordered, r.log[r.next:]...), r.log[:r.next]...)
	} else {
		ordered = append(ordered, r.log[:r.next]...)
	}
	out := ordered[:0]
	for _, rec := range ordered {
		if match == nil || match(rec) {
			out = append(out, rec)
		}
	}
	return out
}

// labelValue keeps caller and domain labels bounded to names the server accepts anyway, so that
// garbage input cannot explode the metrics' cardinality with arbitrary strings.
func labelValue(s, empty string) string {
	if s == "" {
		return empty
	}
	if ValidateDomain(s) != nil && ValidateKey(s) != nil {
		return "invalid"
	}
	return s
}
