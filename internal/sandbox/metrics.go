package sandbox

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kshard/kshard/internal/promtext"
)

// The metrics a replica serves that the live view reads. They are the
// contract between `kshard controller` and the sandbox, and the same ones a
// Prometheus dashboard would use.
const (
	metricShardsOwned   = "kshard_shards_owned"
	metricShardObjects  = "kshard_shard_objects"
	metricReconciles    = "controller_runtime_reconcile_total"
	metricCacheRequests = "kshard_externalcache_requests_total"
	metricExternalCalls = "kshard_external_calls_total"
)

// sample is what one scrape of a replica says, summed over the label values
// the view does not show.
type sample struct {
	at time.Time
	// shards is how many shards the replica holds.
	shards float64
	// objects is the number of primary objects in its shards' caches.
	objects float64
	// reconciles counts reconciles of every controller, every result.
	reconciles float64
	// cache counts external-cache lookups by result (hit, stale, miss,
	// negative).
	cache map[string]float64
	// externalCalls counts calls to the config center, every code.
	externalCalls float64
}

// cacheHitRatio is the share of lookups served from memory, fresh or stale
// (a stale value is served too, and refreshed in the background). ok is
// false before the first lookup.
func (s sample) cacheHitRatio() (ratio float64, ok bool) {
	var all float64
	for _, v := range s.cache {
		all += v
	}
	if all == 0 {
		return 0, false
	}
	return (s.cache["hit"] + s.cache["stale"]) / all, true
}

// reconcileRate is the reconciles per second between two samples of the
// same process. A counter that went down means the process restarted: its
// whole count is new since then.
func reconcileRate(prev, cur sample) (float64, bool) {
	dt := cur.at.Sub(prev.at).Seconds()
	if prev.at.IsZero() || dt <= 0 {
		return 0, false
	}
	d := cur.reconciles - prev.reconciles
	if d < 0 {
		d = cur.reconciles
	}
	return d / dt, true
}

// scraper reads replicas' metrics and readiness over plain HTTP on loopback.
type scraper struct {
	hc *http.Client
}

func newScraper() *scraper {
	return &scraper{hc: &http.Client{Timeout: 2 * time.Second}}
}

// scrape reads a replica's /metrics.
func (s *scraper) scrape(ctx context.Context, addr string) (sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return sample{}, err
	}
	// The classic text format: the one every Prometheus client serves.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.hc.Do(req)
	if err != nil {
		return sample{}, fmt.Errorf("scraping %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sample{}, fmt.Errorf("scraping %s: %s", addr, resp.Status)
	}
	smp, err := parseMetrics(resp.Body)
	if err != nil {
		return sample{}, fmt.Errorf("scraping %s: %w", addr, err)
	}
	smp.at = time.Now()
	return smp, nil
}

// ready reports whether a replica's /readyz answers 200: it holds every
// shard the ring gives it, with synced informers.
func (s *scraper) ready(ctx context.Context, addr string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// parseMetrics reads the Prometheus text format and keeps what the view shows.
func parseMetrics(r io.Reader) (sample, error) {
	families, err := promtext.Parse(r)
	if err != nil {
		return sample{}, err
	}
	s := sample{cache: map[string]float64{}}
	s.shards = promtext.Sum(families[metricShardsOwned])
	s.objects = promtext.Sum(families[metricShardObjects])
	s.reconciles = promtext.Sum(families[metricReconciles])
	s.externalCalls = promtext.Sum(families[metricExternalCalls])
	if f := families[metricCacheRequests]; f != nil {
		for _, m := range f.GetMetric() {
			s.cache[promtext.Label(m, "result")] += promtext.Value(m)
		}
	}
	return s, nil
}
