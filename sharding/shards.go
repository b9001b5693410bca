package sharding

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Shards is the shard side of a sharded controller: what its reconciler and
// its per-shard state (an external cache, a mirror) program against,
// whatever runs the shards. *Replica runs them across the replicas of a
// ring; *Single runs every shard in one replica, for a controller with
// sharding off and as a stand-in in an embedder's tests. A controller wired
// to Shards runs the same code either way.
type Shards interface {
	// Count is the number of shards objects are spread over.
	Count() int32
	// Reader reads the objects of a shard held here: ok is false when the
	// shard is not held.
	Reader(shard int32) (reader client.Reader, ok bool)
	// Holds reports whether the shard is held here now. A write asks
	// WriteContext instead.
	Holds(shard int32) bool
	// WaitForSync waits until the shard's objects can be read here, and
	// reports false when the shard stopped (or ctx ended) first.
	WaitForSync(ctx context.Context, shard int32) bool
	// WriteContext grants one write of the shard's objects: ok is false
	// when the shard is not held now, and the context ends with the hold.
	// Call cancel when the write returned.
	WriteContext(ctx context.Context, shard int32) (wctx context.Context, cancel context.CancelFunc, ok bool)
	// Enqueue requests a reconcile, for events that do not come from the
	// shard's informers (an external value changed). Requests for shards
	// not held are dropped.
	Enqueue(req Request)
	// Identity names this replica, as in the holder of its Leases.
	Identity() string
	// OwnedLabels are the labels an object created for a shard's object
	// carries so that the shard's caches see it: the shard and the domain,
	// under the ring's label prefix (add the controller's own mark for
	// Kind.Selector).
	OwnedLabels(shard int32, domain string) map[string]string
}

// Runtime is what the code that wires a controller needs of whatever runs
// its shards, beyond the Shards its reconciler reads: the one controller
// the held shards feed, a readiness check and the leave at a termination
// signal. Program a setup that chooses between sharding on (*Replica) and
// off (*Single) against it, and one code path wires either.
type Runtime interface {
	Shards
	// NewController creates the controller the shards' requests feed;
	// there is one per Runtime.
	NewController(name string, rec reconcile.TypedReconciler[Request], opts controller.TypedOptions[Request]) (controller.TypedController[Request], error)
	// Ready is a readiness check (a manager's AddReadyzCheck): nil once
	// this replica runs what it should.
	Ready() error
	// Leave prepares this replica's leaving, when the termination signal
	// comes and before the manager stops.
	Leave(ctx context.Context)
}

var (
	_ Runtime = (*Replica)(nil)
	_ Runtime = (*Single)(nil)
)
