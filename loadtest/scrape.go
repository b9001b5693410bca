package loadtest

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/rest"

	"github.com/kshard/kshard/internal/promtext"
)

// The metrics the load tester reads. Replicas serve them on their metrics
// address; the API server on its own /metrics. They are the contract with
// `kshard controller`, the same series a Prometheus dashboard would use.
const (
	metricHeapInuse      = "go_memstats_heap_inuse_bytes"
	metricHeapLive       = "go_gc_heap_live_bytes"
	metricRSS            = "process_resident_memory_bytes"
	metricCPU            = "process_cpu_seconds_total"
	metricShardsOwned    = "kshard_shards_owned"
	metricShardObjects   = "kshard_shard_objects"
	metricUnlabeled      = "kshard_unlabeled_objects"
	metricCachesStarted  = "kshard_caches_started_total"
	metricHandovers      = "kshard_shard_handovers_total"
	metricReconciles     = "controller_runtime_reconcile_total"
	metricReconcileTime  = "controller_runtime_reconcile_time_seconds"
	metricQueueDepth     = "workqueue_depth"
	metricQueueWait      = "workqueue_queue_duration_seconds"
	metricCacheRequests  = "kshard_externalcache_requests_total"
	metricExternalCalls  = "kshard_external_calls_total"
	metricFetches        = "kshard_external_fetches_in_flight"
	metricAPIRequests    = "apiserver_request_total"
	metricAPIDuration    = "apiserver_request_duration_seconds"
	metricAPIRespSizes   = "apiserver_response_sizes"
	metricAPIListFetched = "apiserver_storage_list_fetched_objects_total"
	metricAPIWatchLists  = "apiserver_watch_list_duration_seconds"
	metricAPIInitEvents  = "apiserver_init_events_total"
	metricAPIWatchSizes  = "apiserver_watch_events_sizes"
	metricAPIChecks      = "apiserver_storage_consistency_checks_total"
	metricAPIObjects     = "apiserver_resource_objects"
	metricAPILongRunning = "apiserver_longrunning_requests"
	metricProcessStart   = "process_start_time_seconds"
	controllerName       = "configbinding"
	resourceBindings     = "configbindings"
	resourceConfigMaps   = "configmaps"
	resourceLeases       = "leases"
	cacheResultHit       = "hit"
	cacheResultStale     = "stale"
	reconcileResultError = "error"
)

// families is one parsed scrape.
type families map[string]*dto.MetricFamily

func parseFamilies(r io.Reader) (families, error) {
	f, err := promtext.Parse(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return f, nil
}

// sum adds up the series of a family whose labels include match; a missing
// family sums to zero, as a counter nobody incremented yet. Where "never
// exported" must not read as 0, count tells them apart.
func (f families) sum(name string, match map[string]string) float64 {
	var total float64
	for _, m := range f[name].GetMetric() {
		if matches(m, match) {
			total += promtext.Value(m)
		}
	}
	return total
}

// count is sum, but -1 for a family missing from the scrape. A vector (a
// series per shard, per reason) exports nothing until its first series, so
// one scrape without it proves little; over a fleet's life, a family no
// scrape had is a count the replicas never gave (the metric renamed or
// gone), which a report must not show, nor a test compare, as 0.
func (f families) count(name string, match map[string]string) float64 {
	if _, ok := f[name]; !ok {
		return -1
	}
	return f.sum(name, match)
}

// fetching sums the fetches under way (not those failed and waiting for
// their next round); -1 for a missing family, as count's.
func (f families) fetching() float64 {
	if _, ok := f[metricFetches]; !ok {
		return -1
	}
	var n float64
	for _, state := range []string{"queued", "calling", "backoff"} {
		n += f.sum(metricFetches, map[string]string{"state": state})
	}
	return n
}

// by sums a family's matching series per value of one label; nil for a
// missing family, as count's -1.
func (f families) by(name, label string, match map[string]string) map[string]float64 {
	if _, ok := f[name]; !ok {
		return nil
	}
	out := map[string]float64{}
	for _, m := range f[name].GetMetric() {
		if matches(m, match) {
			out[promtext.Label(m, label)] += promtext.Value(m)
		}
	}
	return out
}

// histogram returns the summed cumulative buckets of a histogram family
// (upper bounds ascending, +Inf last) and the sum of observations.
func (f families) histogram(name string, match map[string]string) (bounds, counts []float64) {
	acc := map[float64]float64{}
	for _, m := range f[name].GetMetric() {
		h := m.GetHistogram()
		if h == nil || !matches(m, match) {
			continue
		}
		for _, b := range h.GetBucket() {
			// The +Inf bucket, when the format carries it, is the sample
			// count, added below.
			if !math.IsInf(b.GetUpperBound(), 1) {
				acc[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		acc[math.Inf(1)] += float64(h.GetSampleCount())
	}
	for b := range acc {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	for _, b := range bounds {
		counts = append(counts, acc[b])
	}
	return bounds, counts
}

// histogramSum is the summed sample count and sum of a histogram family,
// for averages (mean response size).
func (f families) histogramSum(name string, match map[string]string) (count, sum float64) {
	for _, m := range f[name].GetMetric() {
		if h := m.GetHistogram(); h != nil && matches(m, match) {
			count += float64(h.GetSampleCount())
			sum += h.GetSampleSum()
		}
	}
	return count, sum
}

func matches(m *dto.Metric, match map[string]string) bool {
	for k, v := range match {
		if promtext.Label(m, k) != v {
			return false
		}
	}
	return true
}

// cumulative is a histogram as scraped: cumulative counts per upper bound,
// ascending, +Inf last.
type cumulative struct {
	Bounds, Counts []float64
}

// replicaSample is what one scrape of one replica process says.
type replicaSample struct {
	At        time.Time
	HeapInuse float64
	// HeapLive is the heap the last garbage collection marked live
	// (go_gc_heap_live_bytes): what the process holds, without the garbage
	// HeapInuse also counts until the next collection, which varies by a
	// fifth from one scrape to the next at the same objects held. -1 when
	// not exported.
	HeapLive float64
	RSS      float64
	// CPU is the process's CPU seconds so far.
	CPU float64
	// Shards and Objects are the shards held and the ConfigBindings in
	// their caches (kshard_shard_objects); -1 when the scrape had no such
	// family: sharding off, and for Objects also no shard held (a series
	// per shard).
	Shards, Objects float64
	Reconciles      float64
	ReconcileErrors float64
	// Reconcile is the configbinding controller's reconcile time, and
	// QueueWait the time its requests waited in the workqueue before a worker
	// took them: the two parts of end-to-end latency inside a replica.
	Reconcile, QueueWait cumulative
	QueueDepth           float64
	// Cache counts external-cache lookups by result.
	Cache map[string]float64
	// ExternalCalls counts the replica's calls to the config center.
	ExternalCalls float64
	// Fetching is the keys the external cache is fetching for the held
	// shards (kshard_external_fetches_in_flight queued, calling or in
	// backoff): a warm-up under way; -1 when not exported (no cache).
	Fetching float64
	// Unlabeled is kshard_unlabeled_objects: the objects waiting for the
	// labeler's shard label, as its watch counts them. Only the labeler (the
	// replica holding the labeler Lease) sets it; the others export 0; -1
	// when not exported.
	Unlabeled float64
	// Caches counts the informer caches the replica started, by reason
	// (kshard_caches_started_total): each is one initial sync of
	// ConfigBindings at the API server; nil before the first, or when not
	// exported. Acquired counts the shard Leases it acquired; -1 likewise.
	Caches   map[string]float64
	Acquired float64
	// Metric is the value of an extra family the run asked for (the HPA's
	// per-pod metric), summed.
	Metric float64
	// CFSPeriods and CFSThrottled are, for a process held to a CPU quota
	// (Options.ReplicaCPU), the CFS periods it ran in and those that ended
	// with its quota spent, from its cgroup; 0 without one.
	CFSPeriods, CFSThrottled float64
}

// scrapeReplica reads a replica's metrics at url. extra names one more
// family to sum into Metric ("" for none).
func scrapeReplica(ctx context.Context, hc *http.Client, url, extra string) (replicaSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return replicaSample{}, err
	}
	// The classic text format, which every Prometheus client serves.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := hc.Do(req)
	if err != nil {
		return replicaSample{}, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return replicaSample{}, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	f, err := parseFamilies(resp.Body)
	if err != nil {
		return replicaSample{}, fmt.Errorf("scraping %s: %w", url, err)
	}
	s := replicaSampleOf(f, extra)
	s.At = time.Now()
	return s, nil
}

// replicaSampleOf computes a replica sample from one scrape (At unset).
func replicaSampleOf(f families, extra string) replicaSample {
	ctl := map[string]string{"controller": controllerName}
	s := replicaSample{
		HeapInuse:       f.sum(metricHeapInuse, nil),
		HeapLive:        f.count(metricHeapLive, nil),
		RSS:             f.sum(metricRSS, nil),
		CPU:             f.sum(metricCPU, nil),
		Shards:          f.count(metricShardsOwned, nil),
		Objects:         f.count(metricShardObjects, nil),
		Reconciles:      f.sum(metricReconciles, ctl),
		ReconcileErrors: f.sum(metricReconciles, map[string]string{"controller": controllerName, "result": reconcileResultError}),
		QueueDepth:      f.sum(metricQueueDepth, map[string]string{"name": controllerName}),
		Cache:           f.by(metricCacheRequests, "result", nil),
		ExternalCalls:   f.sum(metricExternalCalls, nil),
		Fetching:        f.fetching(),
		Unlabeled:       f.count(metricUnlabeled, nil),
		Caches:          f.by(metricCachesStarted, "reason", nil),
		Acquired:        f.count(metricHandovers, map[string]string{"direction": "acquire"}),
	}
	s.Reconcile.Bounds, s.Reconcile.Counts = f.histogram(metricReconcileTime, ctl)
	s.QueueWait.Bounds, s.QueueWait.Counts = f.histogram(metricQueueWait, map[string]string{"name": controllerName})
	if extra != "" {
		s.Metric = f.sum(extra, nil)
	}
	return s
}

// ready reports whether a replica's /readyz answers 200.
func ready(ctx context.Context, hc *http.Client, addr string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// apiServerSample is the API server's own count of what it served for
// ConfigBindings. Informers of client-go 1.35 and later sync with a
// streaming watch-list (a WATCH with sendInitialEvents) rather than a LIST
// when the server supports it, as kube-apiserver 1.37 does, so an initial
// sync is either.
type apiServerSample struct {
	At time.Time
	// Started is the API server process's start (process_start_time_seconds,
	// Unix seconds): its counters start over with every process, so two
	// samples of different processes have no difference to take.
	Started float64
	// Syncs counts initial syncs of ConfigBindings: LIST requests answered
	// 200 plus completed watch-lists. A LIST refused or failed (429 under
	// load, 410 for a resourceVersion too old) synced nothing, and its
	// retry is counted when it succeeds.
	Syncs float64
	// Scanned counts the ConfigBindings the API server went through to
	// serve them: objects fetched for LISTs plus initial events processed
	// for watches. A label selector does not narrow it: the watch cache has
	// no index on labels, so every sync scans every object of the resource.
	// Fetched is the LISTs' part.
	Scanned, Fetched float64
	// Checks counts the API server's own consistency checks of its
	// ConfigBinding cache (DetectCacheInconsistency, on by default since
	// Kubernetes 1.34, every 5 to 7.5 minutes): each lists every object
	// from the cache and again from etcd, which the fetched objects count
	// though no client synced. Objects is the server's count of
	// ConfigBindings now. minus takes the checks' lists out of Scanned.
	Checks, Objects float64
	// Bytes sums LIST response sizes and watch event sizes (initial and
	// later events alike).
	Bytes float64
	// OpenWatches is the number of ConfigBinding watches open now.
	OpenWatches float64
	// LeaseWrites counts updates, creates and patches of Leases.
	LeaseWrites float64
	// ObjectWrites counts the mutating requests on ConfigBindings and
	// ConfigMaps, every subresource (status) and every code: what a
	// reconcile costs the API server, told apart from Lease renewals and
	// Events, which do not grow with the objects' changes.
	ObjectWrites float64
	// Writes counts every mutating request, all resources.
	Writes float64
	// StatusPatches is the API server's own latency of ConfigBinding status
	// patches (apiserver_request_duration_seconds): the reconcile's last
	// write, timed where it is served, so a report can tell a slower server
	// from a slower client.
	StatusPatches cumulative
}

// scrapeAPIServer reads the API server's /metrics with the load tester's
// credentials (an admin on the control plane it starts).
func scrapeAPIServer(ctx context.Context, rc rest.Interface) (apiServerSample, error) {
	f, err := apiServerFamilies(ctx, rc)
	if err != nil {
		return apiServerSample{}, err
	}
	s, err := apiSampleOf(f)
	if err != nil {
		return apiServerSample{}, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	s.At = time.Now()
	return s, nil
}

// apiSampleOf computes an API server sample from one scrape (At unset). A
// scrape without apiserver_request_total, which every API server exports
// from its first request, is an error: every sync and write count would
// read 0 from it.
func apiSampleOf(f families) (apiServerSample, error) {
	if _, ok := f[metricAPIRequests]; !ok {
		return apiServerSample{}, fmt.Errorf("no %s in the scrape", metricAPIRequests)
	}
	res := map[string]string{"resource": resourceBindings}
	list := map[string]string{"verb": "LIST", "resource": resourceBindings}
	// Syncs are the replicas' informers': cluster-scoped, as
	// serverSyncsOf counts them. A namespaced LIST is a point read (a
	// replica reading a binding by name before it hands its ConfigMap
	// over), not a sync.
	listed := map[string]string{"verb": "LIST", "resource": resourceBindings, "scope": "cluster", "code": "200"}
	var s apiServerSample
	s.Started = f.sum(metricProcessStart, nil)
	watchLists, _ := f.histogramSum(metricAPIWatchLists, map[string]string{"resource": resourceBindings, "scope": "cluster"})
	s.Syncs = f.sum(metricAPIRequests, listed) + watchLists
	s.Fetched = f.sum(metricAPIListFetched, res)
	s.Scanned = s.Fetched + f.sum(metricAPIInitEvents, res)
	for _, status := range []string{"success", "failure"} { // an error ends a check before or while it lists
		s.Checks += f.sum(metricAPIChecks, map[string]string{"resource": resourceBindings, "status": status})
	}
	s.Objects = f.sum(metricAPIObjects, res)
	_, listBytes := f.histogramSum(metricAPIRespSizes, list)
	_, watchBytes := f.histogramSum(metricAPIWatchSizes, res)
	s.Bytes = listBytes + watchBytes
	s.OpenWatches = f.sum(metricAPILongRunning, map[string]string{"verb": "WATCH", "resource": resourceBindings})
	s.StatusPatches.Bounds, s.StatusPatches.Counts = f.histogram(metricAPIDuration, map[string]string{"verb": "PATCH", "resource": resourceBindings, "subresource": "status"})
	for verb, n := range f.by(metricAPIRequests, "verb", map[string]string{"resource": resourceLeases}) {
		if mutating(verb) {
			s.LeaseWrites += n
		}
	}
	for _, resource := range objectResources {
		for verb, n := range f.by(metricAPIRequests, "verb", map[string]string{"resource": resource}) {
			if mutating(verb) {
				s.ObjectWrites += n
			}
		}
	}
	for verb, n := range f.by(metricAPIRequests, "verb", nil) {
		if mutating(verb) {
			s.Writes += n
		}
	}
	return s, nil
}

// relistResources are the resources whose initial syncs after an API
// server restart the relist check counts at the server: the ones the
// replicas cache cluster-wide, and the load tester does not.
var relistResources = []string{resourceBindings, resourceConfigMaps, "externaldomains"}

// serverSyncs is the API server's own count of the initial syncs it
// completed at cluster scope since its process started.
type serverSyncs struct {
	// Started is the process's start (process_start_time_seconds).
	Started time.Time
	// ByResource counts, per relistResources, LISTs answered 200 and
	// watch-lists that sent their initial-events-end bookmark
	// (apiserver_watch_list_duration_seconds observes a watch-list only
	// then): an attempt the server refused or ended before its initial
	// events is not one. Only cluster-scoped requests count: the
	// replicas' informers are cluster-wide, the load tester's are in its
	// own namespaces.
	ByResource map[string]float64
}

// scrapeServerSyncs reads serverSyncs from the API server's /metrics.
func scrapeServerSyncs(ctx context.Context, rc rest.Interface) (serverSyncs, error) {
	f, err := apiServerFamilies(ctx, rc)
	if err != nil {
		return serverSyncs{}, err
	}
	return serverSyncsOf(f)
}

// apiServerFamilies reads and parses the API server's /metrics.
func apiServerFamilies(ctx context.Context, rc rest.Interface) (families, error) {
	body, err := rc.Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	defer body.Close()
	f, err := parseFamilies(body)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's /metrics: %w", err)
	}
	return f, nil
}

// serverSyncsOf computes serverSyncs from one scrape. A scrape without the
// watch-list histogram is an error, not zero syncs: the load tester's own
// informers complete watch-lists from the server's start, so it is there
// unless the metric is gone or renamed.
func serverSyncsOf(f families) (serverSyncs, error) {
	for _, name := range []string{metricAPIWatchLists, metricAPIRequests, metricProcessStart} {
		if _, ok := f[name]; !ok {
			return serverSyncs{}, fmt.Errorf("no %s in the API server's /metrics", name)
		}
	}
	sec := f.sum(metricProcessStart, nil)
	out := serverSyncs{Started: time.Unix(0, int64(sec*1e9)), ByResource: map[string]float64{}}
	for _, res := range relistResources {
		lists := f.sum(metricAPIRequests, map[string]string{"verb": "LIST", "resource": res, "scope": "cluster", "code": "200"})
		watchLists, _ := f.histogramSum(metricAPIWatchLists, map[string]string{"resource": res, "scope": "cluster"})
		out.ByResource[res] = lists + watchLists
	}
	return out, nil
}

// objectResources are the resources whose writes ObjectWrites counts: the
// objects the controller reconciles and the ones it writes for them.
var objectResources = []string{resourceBindings, resourceConfigMaps}

// mutating says whether apiserver_request_total's verb label is a write.
// The API server reports the HTTP method (POST, PUT, PATCH, DELETE, also
// for a collection), APPLY for a server-side-apply PATCH, and GET, LIST,
// WATCH and CONNECT for the rest; CREATE, UPDATE and DELETECOLLECTION are
// in its list of valid verbs too, so they count if they ever appear.
func mutating(verb string) bool {
	switch strings.ToUpper(verb) {
	case "POST", "PUT", "PATCH", "DELETE", "APPLY", "CREATE", "UPDATE", "DELETECOLLECTION":
		return true
	}
	return false
}

// sameServer says whether s and o were scraped from one API server
// process, so that their counters can be subtracted: the same process start,
// and no count that went down (for a server that does not export its
// start).
func (s apiServerSample) sameServer(o apiServerSample) bool {
	return s.Started == o.Started && s.Syncs >= o.Syncs && s.Scanned >= o.Scanned && s.Writes >= o.Writes
}

// minus is the difference of two API server samples (counters) of one
// process (sameServer). The objects the server's consistency checks
// listed in between (two lists of the objects counted at s per check) are
// taken out of Scanned, at most as many as were fetched: a check whose
// lists straddle o is counted at its end, and its part before o must not
// be taken from what clients made the server scan after it.
func (s apiServerSample) minus(o apiServerSample) apiServerSample {
	fetched := s.Fetched - o.Fetched
	checked := min(2*(s.Checks-o.Checks)*s.Objects, fetched)
	return apiServerSample{
		At:            s.At,
		Syncs:         s.Syncs - o.Syncs,
		Scanned:       s.Scanned - o.Scanned - checked,
		Fetched:       fetched - checked,
		Checks:        s.Checks - o.Checks,
		Objects:       s.Objects,
		Bytes:         s.Bytes - o.Bytes,
		OpenWatches:   s.OpenWatches,
		LeaseWrites:   s.LeaseWrites - o.LeaseWrites,
		ObjectWrites:  s.ObjectWrites - o.ObjectWrites,
		Writes:        s.Writes - o.Writes,
		StatusPatches: s.StatusPatches.minus(o.StatusPatches),
	}
}

// minus is the growth of a histogram since o (same bounds; h itself
// otherwise).
func (h cumulative) minus(o cumulative) cumulative {
	counts := slices.Clone(h.Counts)
	if len(o.Counts) == len(counts) {
		for i := range counts {
			counts[i] -= o.Counts[i]
		}
	}
	return cumulative{Bounds: h.Bounds, Counts: counts}
}

// writeMark is the API server's counts at one moment with the object writes
// the load tester had sent by then (run.ownWrites): two marks split the
// object writes between them into the load tester's and the rest, which
// on its control plane are the replicas'.
type writeMark struct {
	api apiServerSample
	own int64
}

// valid says the mark was taken: the API server answered.
func (m writeMark) valid() bool { return !m.api.At.IsZero() }

// spans says whether the API server's counts can be subtracted from
// mark m to mark to: both taken, of one API server process.
func (m writeMark) spans(to writeMark) bool {
	return m.valid() && to.valid() && to.api.sameServer(m.api)
}

// controllerWrites is the object writes between two marks that the load
// tester did not send, and its own. ok is false unless both marks were
// taken from one API server process. A negative difference (a write of the
// load tester's that never reached the server) counts as none.
func controllerWrites(from, to writeMark) (writes float64, own int64, ok bool) {
	if !from.spans(to) {
		return 0, 0, false
	}
	own = to.own - from.own
	return max(to.api.ObjectWrites-from.api.ObjectWrites-float64(own), 0), own, true
}

// perCause divides writes by the number of things that caused them (spec
// updates, moved objects); -1, shown as n/a, when nothing did or the writes
// were not counted.
func perCause(writes float64, counted bool, causes int) float64 {
	if !counted || causes <= 0 {
		return -1
	}
	return writes / float64(causes)
}

// markWrites reads the API server's counts and the load tester's own object
// writes now. Callers mark when the load tester has no write in flight (at
// the edges of a measured phase, before an event without load), so the two
// counts agree on what was sent.
func (r *run) markWrites(ctx context.Context) (writeMark, error) {
	own := r.ownWrites.Load()
	api, err := scrapeAPIServer(ctx, r.rc)
	if err != nil {
		return writeMark{}, err
	}
	return writeMark{api: api, own: own}, nil
}

// Bounds of awaitScansStill: how long the count must hold, and how long
// to wait for that at most.
const (
	scansStillFor    = 3 * time.Second
	scansStillWithin = time.Minute
)

// awaitScansStill waits until the API server's count of ConfigBindings
// scanned has not moved for scansStillFor, at most scansStillWithin, before
// a fleet's start is counted from it or to it. The API server finishes a
// watch-list's scan after its client is gone (the cache watcher filters
// every remaining object, then counts them all), so the syncs a stopped
// fleet had just begun are counted seconds after its processes exit: at
// 100,000 objects, late enough to be billed to the next fleet's start
// without the wait. And a consistency check counts its scans as it goes,
// itself only when done.
func (r *run) awaitScansStill(ctx context.Context) {
	var last apiServerSample
	since, deadline := time.Now(), time.Now().Add(scansStillWithin)
	for time.Now().Before(deadline) {
		s, err := scrapeAPIServer(ctx, r.rc)
		if err != nil {
			r.log.Error(err, "Reading the API server's metrics before a fleet's start")
			return
		}
		if s.Started != last.Started || s.Scanned != last.Scanned {
			last, since = s, time.Now()
		} else if time.Since(since) >= scansStillFor {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	r.progress.printf("%s  the API server's count of ConfigBindings scanned still moved after %s; reading it anyway", r.elapsed(), scansStillWithin)
}

// markWritesOrLog is markWrites for counts a report can do without: a
// failed scrape is logged and leaves the mark invalid.
func (r *run) markWritesOrLog(ctx context.Context) writeMark {
	m, err := r.markWrites(ctx)
	if err != nil {
		r.log.Error(err, "Reading the API server's metrics for write counts")
	}
	return m
}

// formatBytes writes a byte count for people: 12.3 MiB.
func formatBytes(b float64) string {
	const unit = 1024
	if b < unit {
		return strconv.FormatFloat(b, 'f', 0, 64) + " B"
	}
	div, exp := float64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", b/div, "KMGTP"[exp])
}
