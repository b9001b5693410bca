package externalcache

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The collectors are package level and registered once on controller-runtime's registry, so that
// a manager serves them with its own metrics and several caches in one process (tests) add up
// instead of colliding. Gauges read every live cache at scrape time.
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_externalcache_requests_total",
		Help: "Cache lookups by result: hit (fresh), stale (served while refreshing), miss (pending fetch) and negative (cached not-found).",
	}, []string{"result"})
	callsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_external_calls_total",
		Help: "Fetch calls made to the external service, by code: ok, not_found, the service's status code, timeout, canceled or error. Calls the circuit breaker rejected are not made and not counted.",
	}, []string{"code"})
	callDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kshard_external_call_duration_seconds",
		Help:    "Duration of fetch calls to the external service.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})
	notificationsDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kshard_externalcache_notifications_dropped_total",
		Help: "Update notifications dropped because NotifyQueueSize distinct keys were already waiting for OnUpdate.",
	})
	queueRejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kshard_external_fetch_queue_rejected_total",
		Help: "Fetches not enqueued by Get because the fetch queue was full (the next Get tries again).",
	})
	evictionsTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kshard_externalcache_evictions_total",
		Help: "Servable entries evicted to make room for others: the values the replica reads do not fit in MaxBytes (--cache-max-bytes) together.",
	})
	fallbackRefreshes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kshard_externalcache_feed_fallback_refreshes_total",
		Help: "Values refreshed on their soft TTL because the change feed of their domain was unhealthy (see kshard_externalcache_unhealthy_feeds).",
	})
	retryAfterCapped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kshard_externalcache_retry_after_capped_total",
		Help: "Retry-After answers longer than MaxRetryAfter (--cache-max-retry-after), honoured only up to it.",
	})

	hitCounter      = requestsTotal.WithLabelValues("hit")
	staleCounter    = requestsTotal.WithLabelValues("stale")
	missCounter     = requestsTotal.WithLabelValues("miss")
	negativeCounter = requestsTotal.WithLabelValues("negative")
)

// live is the set of started caches the gauges read.
var live = struct {
	sync.Mutex
	caches map[*Cache]struct{}
}{caches: map[*Cache]struct{}{}}

func gaugeOverLive(name, help string, read func(*Cache) float64, combine func(acc, v float64) float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
		live.Lock()
		defer live.Unlock()
		var acc float64
		for c := range live.caches {
			acc = combine(acc, read(c))
		}
		return acc
	})
}

func sum(acc, v float64) float64 { return acc + v }

func maxOf(acc, v float64) float64 { return max(acc, v) }

func init() {
	metrics.Registry.MustRegister(requestsTotal, callsTotal, callDuration, notificationsDropped, queueRejected, retryAfterCapped, evictionsTotal, fallbackRefreshes,
		gaugeOverLive("kshard_externalcache_retry_after_hold_seconds", "How long no call is made to the source yet, because it answered with a Retry-After (capped at MaxRetryAfter).",
			func(c *Cache) float64 { return max(0, c.hold.remaining().Seconds()) }, maxOf),
		gaugeOverLive("kshard_externalcache_entries", "Entries held by the cache, all shards.",
			func(c *Cache) float64 { return float64(c.Stats().Entries) }, sum),
		gaugeOverLive("kshard_externalcache_bytes", "Bytes allocated for entries, all shards; bounded by MaxBytes.",
			func(c *Cache) float64 { return float64(c.Stats().Bytes) }, sum),
		gaugeOverLive("kshard_external_circuit_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open (the worst of the process's caches).",
			func(c *Cache) float64 { return float64(c.breaker.State()) }, maxOf),
		gaugeOverLive("kshard_external_fetch_queue_depth", "Fetches waiting for a worker.",
			func(c *Cache) float64 { return float64(c.queueDepth()) }, sum),
		gaugeOverLive("kshard_externalcache_domains", "Domains the held shards use: each has one change-feed long poll. "+
			"A domain is released when the last object of its shard that reads it goes, so this follows the domains in use.",
			func(c *Cache) float64 { return float64(c.usedDomains()) }, sum),
	)
	for why := troubleFailing; why <= troubleEpochFlapping; why++ {
		metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kshard_externalcache_unhealthy_feeds",
			Help: "Domains whose change feed is unhealthy, by reason: failing (polls fail), short_polls (long polls come back at once with no changes), " +
				"epoch_flapping (answers from more than one history). Their values are refreshed on their soft TTL instead.",
			ConstLabels: prometheus.Labels{"reason": why.String()},
		}, func() float64 {
			live.Lock()
			defer live.Unlock()
			var n int
			for c := range live.caches {
				n += c.unhealthyFeeds(why)
			}
			return float64(n)
		}))
	}
	for state := range stateFailed + 1 {
		metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kshard_external_fetches_in_flight",
			Help: "Keys of held shards with a fetch under way, by state: queued (waiting for a worker), calling (a worker calls the source), " +
				"backoff (waiting for a retry) and failed (waiting for the next round after a failed one). A count that never falls is a stuck key.",
			ConstLabels: prometheus.Labels{"state": state.String()},
		}, func() float64 {
			live.Lock()
			defer live.Unlock()
			var n int
			for c := range live.caches {
				n += c.flightsIn(state)
			}
			return float64(n)
		}))
	}
}

func addLive(c *Cache) {
	live.Lock()
	defer live.Unlock()
	live.caches[c] = struct{}{}
}

func removeLive(c *Cache) {
	live.Lock()
	defer live.Unlock()
	delete(live.caches, c)
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
