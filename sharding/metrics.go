package sharding

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Sharding metrics, registered on controller-runtime's registry so they are
// served next to controller_runtime_* and workqueue_* on the manager's
// metrics endpoint. Every series carries its ring, so replicas of several
// rings in one process or one Prometheus stay apart. Ring-wide gauges (ring
// members, unowned shards) are exported identically by every replica: take
// max() across replicas.
var (
	ringMembers = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_ring_members",
		Help: "Live members of the ring, as this replica sees them.",
	}, []string{"ring"})
	shardsOwned = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_shards_owned",
		Help: "Shards this replica holds the Lease of and runs.",
	}, []string{"ring"})
	shardObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_shard_objects",
		Help: "Primary objects in the informer cache of each shard this replica holds.",
	}, []string{"ring", "shard"})
	shardHandovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_shard_handovers_total",
		Help: "Shards acquired or released by this replica, by reason.",
	}, []string{"ring", "direction", "reason"})
	shardAcquireDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kshard_shard_acquire_duration_seconds",
		Help:    "Time from deciding to acquire a shard to its informers being synced.",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30},
	}, []string{"ring"})
	unownedShards = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_unowned_shards",
		Help: "Shards whose Lease is missing, released or expired, as this replica sees them.",
	}, []string{"ring"})
	unlabeledObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_unlabeled_objects",
		Help: "Primary objects without a valid shard label, as the labeling leader sees them.",
	}, []string{"ring"})
	labelerLeader = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_labeler_leader",
		Help: "1 while this replica holds the ring's labeler Lease and labels unlabeled objects.",
	}, []string{"ring"})
	shardTableDomains = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_shard_table_domains",
		Help: "Domains in the ring's shard table, which the API server labels at admission, as the labeling leader wrote it.",
	}, []string{"ring"})
	shardTableFull = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_shard_table_full",
		Help: "1 while the ring's shard table holds its 1 MiB of domain names: objects of domains new to it are labeled by the labeler.",
	}, []string{"ring"})
	cachesStarted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_caches_started_total",
		Help: "Informer caches this replica started, by reason: acquisition (a batch of shards acquired together), " +
			"compaction (a cache rebuilt for fewer shards), labeler (a term of the elected labeler). Each begins with one " +
			"initial sync (LIST or watch-list) of the primary kind, for which the API server scans the whole collection.",
	}, []string{"ring", "reason"})
	shardCountMismatch = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_ring_shard_count_mismatch",
		Help: "1 while this replica's shard count differs from the ring's, so it claims nothing.",
	}, []string{"ring"})
	ringSyncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_ring_syncs_total",
		Help: "Passes of this replica's ring coordinator: each reads every ring Lease from the cache and recomputes " +
			"the ring and the shards to claim or release. A change of holder or membership starts one at once; " +
			"renewals only at the next expiry or retry period.",
	}, []string{"ring"})
	refusedRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_refused_write_retries_total",
		Help: "Reconciles retried because WriteContext refused a write while the shard stayed held: its hold had " +
			"lapsed for a moment (a late renewal, a pause). Rising steadily, renewals are starved: give the replica CPU.",
	}, []string{"ring"})
)

func init() {
	metrics.Registry.MustRegister(ringMembers, shardsOwned, shardObjects, shardHandovers,
		shardAcquireDuration, unownedShards, unlabeledObjects, labelerLeader, shardCountMismatch, cachesStarted,
		shardTableDomains, shardTableFull, ringSyncs, refusedRetries)
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

// newRingMetrics binds the ring's label, which also exports every gauge at
// zero from the start.
func newRingMetrics(ring string) ringMetrics {
	l := prometheus.Labels{"ring": ring}
	return ringMetrics{
		members:        ringMembers.With(l),
		owned:          shardsOwned.With(l),
		unowned:        unownedShards.With(l),
		unlabeled:      unlabeledObjects.With(l),
		labeler:        labelerLeader.With(l),
		mismatch:       shardCountMismatch.With(l),
		tableDomains:   shardTableDomains.With(l),
		tableFull:      shardTableFull.With(l),
		syncs:          ringSyncs.With(l),
		refusedRetries: refusedRetries.With(l),
		objects:        shardObjects.MustCurryWith(l),
		handovers:      shardHandovers.MustCurryWith(l),
		caches:         cachesStarted.MustCurryWith(l),
		acquire:        shardAcquireDuration.With(l),
	}
}
