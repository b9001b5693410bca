package externalcache

import (
	"regexp"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// DefaultMetricsPrefix begins the metric names of a Cache unless
// Options.MetricsPrefix names another.
const DefaultMetricsPrefix = "kshard"

// metricsPrefix is what a metric name may begin with.
var metricsPrefix = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// cacheMetrics are the metrics of every Cache with one name prefix,
// registered once on controller-runtime's registry, so that a manager
// serves them with its own metrics and several caches in one process
// (tests) add up instead of colliding. Its gauges read its live caches at
// scrape time.
type cacheMetrics struct {
	calls                                          *prometheus.CounterVec
	callDuration                                   prometheus.Histogram
	notificationsDropped, queueRejected, evictions prometheus.Counter
	fallbackRefreshes, retryAfterCapped            prometheus.Counter
	hit, stale, miss, negative                     prometheus.Counter
	mu                                             sync.Mutex
	live                                           map[*Cache]struct{}
}

var (
	metricsMu sync.Mutex
	// metricsByPrefix holds the metrics of each prefix in use.
	metricsByPrefix = map[string]*cacheMetrics{}
)

// metricsFor returns the metrics named under prefix, created and
// registered the first time a Cache asks.
func metricsFor(prefix string) *cacheMetrics {
	metricsMu.Lock()
	defer metricsMu.Unlock()
	if m := metricsByPrefix[prefix]; m != nil {
		return m
	}
	m := &cacheMetrics{live: map[*Cache]struct{}{}}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: prefix + "_externalcache_requests_total",
		Help: "Cache lookups by result: hit (fresh), stale (served while refreshing), miss (pending fetch) and negative (cached not-found).",
	}, []string{"result"})
	m.hit, m.stale = requests.WithLabelValues("hit"), requests.WithLabelValues("stale")
	m.miss, m.negative = requests.WithLabelValues("miss"), requests.WithLabelValues("negative")
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: prefix + "_external_calls_total",
		Help: "Fetch calls made to the external service, by code: ok, not_found, the service's status code, timeout, canceled or error. Calls the circuit breaker rejected are not made and not counted.",
	}, []string{"code"})
	m.callDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    prefix + "_external_call_duration_seconds",
		Help:    "Duration of fetch calls to the external service.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})
	m.notificationsDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: prefix + "_externalcache_notifications_dropped_total",
		Help: "Update notifications dropped because NotifyQueueSize distinct keys were already waiting for OnUpdate.",
	})
	m.queueRejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: prefix + "_external_fetch_queue_rejected_total",
		Help: "Fetches not enqueued by Get because the fetch queue was full (the next Get tries again).",
	})
	m.evictions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: prefix + "_externalcache_evictions_total",
		Help: "Servable entries evicted to make room for others: the values the replica reads do not fit in MaxBytes together (kshard controller: a quarter of --memory-limit).",
	})
	m.fallbackRefreshes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: prefix + "_externalcache_feed_fallback_refreshes_total",
		Help: "Values refreshed on their soft TTL because the change feed of their domain was unhealthy (see " + prefix + "_externalcache_unhealthy_feeds).",
	})
	m.retryAfterCapped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: prefix + "_externalcache_retry_after_capped_total",
		Help: "Retry-After answers longer than MaxRetryAfter (--cache-max-retry-after), honoured only up to it.",
	})
	metrics.Registry.MustRegister(requests, m.calls, m.callDuration, m.notificationsDropped, m.queueRejected, m.retryAfterCapped, m.evictions, m.fallbackRefreshes,
		m.gauge(prefix+"_externalcache_retry_after_hold_seconds", "How long no call is made to the source yet, because it answered with a Retry-After (capped at MaxRetryAfter).",
			nil, func(c *Cache) float64 { return max(0, c.guard.hold.remaining().Seconds()) }, maxOf),
		m.gauge(prefix+"_externalcache_entries", "Entries held by the cache, all shards.",
			nil, func(c *Cache) float64 { return float64(c.Stats().Entries) }, sum),
		m.gauge(prefix+"_externalcache_bytes", "Bytes allocated for entries, all shards; bounded by MaxBytes.",
			nil, func(c *Cache) float64 { return float64(c.Stats().Bytes) }, sum),
		m.gauge(prefix+"_external_circuit_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open (the worst of the process's caches).",
			nil, func(c *Cache) float64 { return float64(c.guard.breaker.State()) }, maxOf),
		m.gauge(prefix+"_external_fetch_queue_depth", "Fetches waiting for a worker.",
			nil, func(c *Cache) float64 { queued, _ := c.fetcher.counts(); return float64(queued) }, sum),
		m.gauge(prefix+"_externalcache_domains", "Domains the held shards use: each has one change-feed long poll. "+
			"A domain is released when the last object of its shard that reads it goes, so this follows the domains in use.",
			nil, func(c *Cache) float64 { return float64(c.usedDomains()) }, sum),
	)
	for why := troubleFailing; why <= troubleEpochFlapping; why++ {
		metrics.Registry.MustRegister(m.gauge(prefix+"_externalcache_unhealthy_feeds",
			"Domains whose change feed is unhealthy, by reason: failing (polls fail), short_polls (long polls come back at once with no changes), "+
				"epoch_flapping (answers from more than one history). Their values are refreshed on their soft TTL instead.",
			prometheus.Labels{"reason": why.String()}, func(c *Cache) float64 { return float64(c.feeds.unhealthy(why)) }, sum))
	}
	for state := range stateFailed + 1 {
		metrics.Registry.MustRegister(m.gauge(prefix+"_external_fetches_in_flight",
			"Keys of held shards with a fetch under way, by state: queued (waiting for a worker), calling (a worker calls the source), "+
				"backoff (waiting for a retry) and failed (waiting for the next round after a failed one). A count that never falls is a stuck key.",
			prometheus.Labels{"state": state.String()}, func(c *Cache) float64 { return float64(c.fetcher.flightsIn(state)) }, sum))
	}
	metricsByPrefix[prefix] = m
	return m
}

// gauge reads every live cache at scrape time and combines what it reads.
func (m *cacheMetrics) gauge(name, help string, labels prometheus.Labels, read func(*Cache) float64, combine func(acc, v float64) float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 {
		m.mu.Lock()
		defer m.mu.Unlock()
		var acc float64
		for c := range m.live {
			acc = combine(acc, read(c))
		}
		return acc
	})
}

func sum(acc, v float64) float64 { return acc + v }

func maxOf(acc, v float64) float64 { return max(acc, v) }

// addLive makes the gauges read c while it runs.
func (m *cacheMetrics) addLive(c *Cache) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.live[c] = struct{}{}
}

func (m *cacheMetrics) removeLive(c *Cache) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.live, c)
}

// callCode is the code label of kshard_external_calls_total, bounded to a small set of values.
func callCode(err error, class failureClass) string {
	switch class {
	case classOK:
		return "ok"
	case classNotFound:
		return "not_found"
	case classCanceled:
		return "canceled"
	}
	if code, ok := statusCode(err); ok && code >= 100 && code <= 599 {
		return strconv.Itoa(code)
	}
	if isTimeout(err) {
		return "timeout"
	}
	return "error"
}
