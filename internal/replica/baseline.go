package replica

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/sharding"
)

// The baselines kshard is measured against: one active replica for
// everything (--sharding=off), and calls to the config center inside
// Reconcile (--external-mode=direct).

// singleReplica adapts one cache of everything to configbinding's Shards, for
// --sharding=off: the classic single active replica (leader election, one
// informer per kind for the whole cluster) that the sharding benchmarks
// compare against. Every shard is "held" by the elected leader.
type singleReplica struct {
	cache   client.Reader
	mu      sync.Mutex
	queue   workqueue.TypedRateLimitingInterface[sharding.Request]
	elected <-chan struct{}
}

// newSingleReplica returns the adapter; elected closes when this replica
// becomes the leader (manager.Elected()).
func newSingleReplica(c client.Reader, elected <-chan struct{}) *singleReplica {
	return &singleReplica{cache: c, elected: elected}
}

// Reader implements configbinding.Shards.
func (s *singleReplica) Reader(int32) (client.Reader, bool) { return s.cache, true }

// WriteContext implements configbinding.Shards: writes are granted while elected. The
// manager exits when it loses the election.
func (s *singleReplica) WriteContext(ctx context.Context, _ int32) (context.Context, context.CancelFunc, bool) {
	select {
	case <-s.elected:
		return ctx, func() {}, true
	default:
		return ctx, func() {}, false
	}
}

// Enqueue implements configbinding.Enqueuer.
func (s *singleReplica) Enqueue(req sharding.Request) {
	s.mu.Lock()
	q := s.queue
	s.mu.Unlock()
	if q != nil {
		q.Add(req)
	}
}

// Source captures the controller's queue for Enqueue.
func (s *singleReplica) Source() source.TypedSource[sharding.Request] {
	return source.TypedFunc[sharding.Request](func(_ context.Context, q workqueue.TypedRateLimitingInterface[sharding.Request]) error {
		s.mu.Lock()
		s.queue = q
		s.mu.Unlock()
		return nil
	})
}

// directValues calls the source synchronously, one call per key per
// reconcile (--external-mode=direct). It exists only as a baseline: a slow
// or failing source stalls every worker.
type directValues struct {
	Source  externalcache.Source
	Timeout time.Duration
}

// Get implements configbinding.Values.
func (v directValues) Get(ctx context.Context, _ int32, key externalcache.Key) externalcache.Lookup {
	if v.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, v.Timeout)
		defer cancel()
	}
	val, err := v.Source.Fetch(ctx, key)
	switch {
	case err == nil:
		return externalcache.Lookup{Value: val.Data, Revision: val.Revision, FetchedAt: time.Now(), State: externalcache.StateFresh}
	case errors.Is(err, externalcache.ErrNotFound):
		return externalcache.Lookup{State: externalcache.StateNotFound, FetchedAt: time.Now()}
	default:
		return externalcache.Lookup{State: externalcache.StatePending, Err: err}
	}
}
