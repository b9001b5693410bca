package sharding

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Sharding metrics, registered on controller-runtime's registry so they are
// served next to controller_runtime_* and workqueue_* on the manager's
// metrics endpoint. Ring-wide gauges (ring members, unowned shards) are
// exported identically by every replica: take max() across replicas.
var (
	ringMembers = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kshard_ring_members",
		Help: "Live members of the ring, as this replica sees them.",
	})
	shardsOwned = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kshard_shards_owned",
		Help: "Shards this replica holds the Lease of and runs.",
	})
	shardObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kshard_shard_objects",
		Help: "Primary objects in the informer cache of each shard this replica holds.",
	}, []string{"shard"})
	shardHandovers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_shard_handovers_total",
		Help: "Shards acquired or released by this replica, by reason.",
	}, []string{"direction", "reason"})
	shardAcquireDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kshard_shard_acquire_duration_seconds",
		Help:    "Time from deciding to acquire a shard to its informers being synced.",
		Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30},
	})
	unownedShards = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kshard_unowned_shards",
		Help: "Shards whose Lease is missing, released or expired, as this replica sees them.",
	})
	unlabeledObjects = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kshard_unlabeled_objects",
		Help: "Primary objects without a valid shard label, as the labeling leader sees them.",
	})
	shardCountMismatch = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kshard_ring_shard_count_mismatch",
		Help: "1 while this replica's shard count differs from the ring's, so it claims nothing.",
	})
)

func init() {
	metrics.Registry.MustRegister(ringMembers, shardsOwned, shardObjects, shardHandovers,
		shardAcquireDuration, unownedShards, unlabeledObjects, shardCountMismatch)
}
