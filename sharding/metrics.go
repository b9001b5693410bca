package sharding

import (
	"regexp"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// metricVecs are the sharding metrics under one name prefix, registered
// on controller-runtime's registry so they are served next to
// controller_runtime_* and workqueue_* on the manager's metrics endpoint.
// Every series carries its ring, so replicas of several rings in one process
// or one Prometheus stay apart. Ring-wide gauges (ring members, unowned
// shards) are exported identically by every replica: take max() across
// replicas.
type metricVecs struct {
	ringMembers, shardsOwned, shardObjects, unownedShards, unlabeledObjects, labelerLeader *prometheus.GaugeVec
	shardTableDomains, shardTableFull, shardCountMismatch                                  *prometheus.GaugeVec
	shardHandovers, cachesStarted, ringSyncs, refusedRetries                               *prometheus.CounterVec
	shardAcquireDuration                                                                   *prometheus.HistogramVec
}

// DefaultMetricsPrefix begins the metric names of a Replica unless
// Options.MetricsPrefix names another.
const DefaultMetricsPrefix = "kshard"

// metricsPrefix is what a metric name may begin with.
var metricsPrefix = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

var (
	vecsMu sync.Mutex
	// vecsByPrefix holds the metrics of each prefix in use, registered once
	// whatever the number of Replicas sharing it.
	vecsByPrefix = map[string]*metricVecs{}
)

// vecsFor returns the metrics named under prefix, created and registered
// the first time a Replica asks.
func vecsFor(prefix string) *metricVecs {
	vecsMu.Lock()
	defer vecsMu.Unlock()
	if v := vecsByPrefix[prefix]; v != nil {
		return v
	}
	v := &metricVecs{

		ringMembers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_ring_members",
			Help: "Live members of the ring, as this replica sees them.",
		}, []string{"ring"}),
		shardsOwned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_shards_owned",
			Help: "Shards this replica holds the Lease of and runs.",
		}, []string{"ring"}),
		shardObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_shard_objects",
			Help: "Primary objects in the informer cache of each shard this replica holds.",
		}, []string{"ring", "shard"}),
		shardHandovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_shard_handovers_total",
			Help: "Shards acquired or released by this replica, by reason.",
		}, []string{"ring", "direction", "reason"}),
		shardAcquireDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    prefix + "_shard_acquire_duration_seconds",
			Help:    "Time from deciding to acquire a shard to its informers being synced.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30},
		}, []string{"ring"}),
		unownedShards: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_unowned_shards",
			Help: "Shards whose Lease is missing, released or expired, as this replica sees them.",
		}, []string{"ring"}),
		unlabeledObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_unlabeled_objects",
			Help: "Primary objects without a valid shard label, as the labeling leader sees them.",
		}, []string{"ring"}),
		labelerLeader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_labeler_leader",
			Help: "1 while this replica holds the ring's labeler Lease and labels unlabeled objects.",
		}, []string{"ring"}),
		shardTableDomains: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_shard_table_domains",
			Help: "Domains in the ring's shard table, which the API server labels at admission, as the labeling leader wrote it.",
		}, []string{"ring"}),
		shardTableFull: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_shard_table_full",
			Help: "1 while the ring's shard table holds its 1 MiB of domain names: objects of domains new to it are labeled by the labeler.",
		}, []string{"ring"}),
		cachesStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_caches_started_total",
			Help: "Informer caches this replica started, by reason: acquisition (a batch of shards acquired together), " +
				"compaction (a cache rebuilt for fewer shards), warm-up (a cache of the shards a leaving replica hands this one), " +
				"labeler (a term of the elected labeler). Each begins with one " +
				"initial sync (LIST or watch-list) of the primary kind, for which the API server scans the whole collection.",
		}, []string{"ring", "reason"}),
		shardCountMismatch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: prefix + "_ring_shard_count_mismatch",
			Help: "1 while this replica's shard count differs from the ring's, so it claims nothing.",
		}, []string{"ring"}),
		ringSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_ring_syncs_total",
			Help: "Passes of this replica's ring coordinator: each reads every ring Lease from the cache and recomputes " +
				"the ring and the shards to claim or release. A change of holder or membership starts one at once; " +
				"renewals only at the next expiry or retry period.",
		}, []string{"ring"}),
		refusedRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: prefix + "_refused_write_retries_total",
			Help: "Reconciles retried because WriteContext refused a write while the shard stayed held: its hold had " +
				"lapsed for a moment (a late renewal, a pause). Rising steadily, renewals are starved: give the replica CPU.",
		}, []string{"ring"}),
	}
	metrics.Registry.MustRegister(v.ringMembers, v.shardsOwned, v.shardObjects, v.shardHandovers,
		v.shardAcquireDuration, v.unownedShards, v.unlabeledObjects, v.labelerLeader, v.shardCountMismatch, v.cachesStarted,
		v.shardTableDomains, v.shardTableFull, v.ringSyncs, v.refusedRetries)
	vecsByPrefix[prefix] = v
	return v
}

// ringMetrics are the metrics of one Replica, with its ring's label bound.
type ringMetrics struct {
	members, owned, unowned, unlabeled, labeler, mismatch prometheus.Gauge
	tableDomains, tableFull                               prometheus.Gauge
	syncs, refusedRetries                                 prometheus.Counter
	objects                                               *prometheus.GaugeVec   // by shard
	handovers                                             *prometheus.CounterVec // by direction and reason
	caches                                                *prometheus.CounterVec // started, by reason
	acquire                                               prometheus.Observer
}

// newRingMetrics binds the ring's label to the metrics named under prefix,
// which also exports every gauge at zero from the start.
func newRingMetrics(prefix, ring string) ringMetrics {
	v, l := vecsFor(prefix), prometheus.Labels{"ring": ring}
	return ringMetrics{
		members:        v.ringMembers.With(l),
		owned:          v.shardsOwned.With(l),
		unowned:        v.unownedShards.With(l),
		unlabeled:      v.unlabeledObjects.With(l),
		labeler:        v.labelerLeader.With(l),
		mismatch:       v.shardCountMismatch.With(l),
		tableDomains:   v.shardTableDomains.With(l),
		tableFull:      v.shardTableFull.With(l),
		syncs:          v.ringSyncs.With(l),
		refusedRetries: v.refusedRetries.With(l),
		objects:        v.shardObjects.MustCurryWith(l),
		handovers:      v.shardHandovers.MustCurryWith(l),
		caches:         v.cachesStarted.MustCurryWith(l),
		acquire:        v.shardAcquireDuration.With(l),
	}
}
