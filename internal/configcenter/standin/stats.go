package standin

import (
	"sort"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kshard/kshard/internal/configcenter"
)

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
	log    []configcenter.RequestRecord
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
		log:    make([]configcenter.RequestRecord, logSize),
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

func (r *recorder) record(rec configcenter.RequestRecord) {
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

func (r *recorder) stats() configcenter.Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := configcenter.Stats{Routes: map[string]map[string]int64{}, Series: make([]configcenter.StatSeries, 0, len(r.counts))}
	for k, n := range r.counts {
		s.Total += n
		codes := s.Routes[k.route]
		if codes == nil {
			codes = map[string]int64{}
			s.Routes[k.route] = codes
		}
		codes[strconv.Itoa(k.code)] += n
		s.Series = append(s.Series, configcenter.StatSeries{Caller: k.caller, Domain: k.domain, Route: k.route, Code: k.code, Count: n})
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
func (r *recorder) requests(match func(configcenter.RequestRecord) bool) []configcenter.RequestRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ordered []configcenter.RequestRecord
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
	if configcenter.ValidateDomain(s) != nil && configcenter.ValidateKey(s) != nil {
		return "invalid"
	}
	return s
}
