package configbinding

import (
	"context"
	"sync"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kshard/kshard/sharding"
)

// SingleReplica adapts one cache of everything to the Shards interface, for
// --sharding=off: the classic single active replica (leader election, one
// informer per kind for the whole cluster) that the sharding benchmarks
// compare against. Every shard is "held" by the elected leader.
type SingleReplica struct {
	Cache   client.Reader
	mu      sync.Mutex
	queue   workqueue.TypedRateLimitingInterface[sharding.Request]
	elected <-chan struct{}
}

// NewSingleReplica returns the adapter; elected closes when this replica
// becomes the leader (manager.Elected()).
func NewSingleReplica(c client.Reader, elected <-chan struct{}) *SingleReplica {
	return &SingleReplica{Cache: c, elected: elected}
}

// Reader implements Shards.
func (s *SingleReplica) Reader(int32) (client.Reader, bool) { return s.Cache, true }

// WriteContext implements Shards: writes are granted while elected. The
// manager exits when it loses the election.
func (s *SingleReplica) WriteContext(ctx context.Context, _ int32) (context.Context, context.CancelFunc, bool) {
	select {
	case <-s.elected:
		return ctx, func() {}, true
	default:
		return ctx, func() {}, false
	}
}

// Enqueue implements Enqueuer.
func (s *SingleReplica) Enqueue(req sharding.Request) {
	s.mu.Lock()
	q := s.queue
	s.mu.Unlock()
	if q != nil {
		q.Add(req)
	}
}

// Source captures the controller's queue for Enqueue.
func (s *SingleReplica) Source() source.TypedSource[sharding.Request] {
	return source.TypedFunc[sharding.Request](func(_ context.Context, q workqueue.TypedRateLimitingInterface[sharding.Request]) error {
		s.mu.Lock()
		s.queue = q
		s.mu.Unlock()
		return nil
	})
}
