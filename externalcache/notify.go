package externalcache

import (
	"context"
	"github.com/prometheus/client_golang/prometheus"
	"sync"

	"github.com/go-logr/logr"
)

// notifier calls OnUpdate from one goroutine so that fetch workers never wait for the
// controller. Pending notifications are a set: a key notified again before its first
// notification was delivered is delivered once (the controller reads the current state anyway).
// The set is bounded by NotifyQueueSize distinct keys; beyond it notifications are dropped,
// counted in kshard_externalcache_notifications_dropped_total and logged, never silently.
type notifier struct {
	fn func(shard int32, key Key)
	// domainFn is told of a domain's feed health: its pending entries have a key without a name,
	// which no valid key has.
	domainFn func(shard int32, domain string)
	max      int
	log      logr.Logger
	// droppedCount counts the dropped notifications for the metrics.
	droppedCount prometheus.Counter

	mu      sync.Mutex
	pending map[flightKey]struct{}
	order   []flightKey
	dropped int
	wake    chan struct{}
}

func newNotifier(fn func(int32, Key), domainFn func(int32, string), maxPending int, log logr.Logger, dropped prometheus.Counter) *notifier {
	return &notifier{fn: fn, domainFn: domainFn, max: maxPending, log: log, droppedCount: dropped, pending: map[flightKey]struct{}{}, wake: make(chan struct{}, 1)}
}

// addDomain tells domainFn that the health of domain's feed changed, for shard.
func (n *notifier) addDomain(shard int32, domain string) {
	n.add(flightKey{shard: shard, key: Key{Domain: domain}})
}

func (n *notifier) add(fk flightKey) {
	if (fk.key.Name != "" && n.fn == nil) || (fk.key.Name == "" && n.domainFn == nil) {
		return
	}
	n.mu.Lock()
	switch _, dup := n.pending[fk]; {
	case dup:
	case len(n.pending) >= n.max:
		n.dropped++
		n.droppedCount.Inc()
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
			if fk.key.Name == "" {
				n.domainFn(fk.shard, fk.key.Domain)
			} else {
				n.fn(fk.shard, fk.key)
			}
		}
	}
}
