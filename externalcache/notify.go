package externalcache

import (
	"context"
	"sync"

	"github.com/go-logr/logr"
)

// notifier calls OnUpdate from one goroutine so that fetch workers never wait for the
// controller. Pending notifications are a set: a key notified again before its first
// notification was delivered is delivered once (the controller reads the current state anyway).
// The set is bounded by NotifyQueueSize distinct keys; beyond it notifications are dropped,
// counted in kshard_externalcache_notifications_dropped_total and logged, never silently.
type notifier struct {
	fn  func(shard int32, key Key)
	max int
	log logr.Logger

	mu      sync.Mutex
	pending map[flightKey]struct{}
	order   []flightKey
	dropped int
	wake    chan struct{}
}

func newNotifier(fn func(int32, Key), maxPending int, log logr.Logger) *notifier {
	return &notifier{fn: fn, max: maxPending, log: log, pending: map[flightKey]struct{}{}, wake: make(chan struct{}, 1)}
}

func (n *notifier) add(fk flightKey) {
	if n.fn == nil {
		return
	}
	n.mu.Lock()
	switch _, dup := n.pending[fk]; {
	case dup:
	case len(n.pending) >= n.max:
		n.dropped++
		notificationsDropped.Inc()
	default:
		n.pending[fk] = struct{}{}
		n.order = append(n.order, fk)
	}
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *notifier) run(ctx context.Context) {
	for {
		select {
		case <-n.wake:
		case <-ctx.Done():
			return
		}
		n.mu.Lock()
		batch, dropped := n.order, n.dropped
		n.order, n.dropped = nil, 0
		clear(n.pending)
		n.mu.Unlock()
		if dropped > 0 {
			n.log.Error(nil, "Dropped update notifications: OnUpdate is slower than keys change", "dropped", dropped, "limit", n.max)
		}
		for _, fk := range batch {
			if ctx.Err() != nil {
				return
			}
			n.fn(fk.shard, fk.key)
		}
	}
}
