package sharding

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/kshard/kshard/internal/backoff"
)

// A watch of the few objects the ring's decisions rest on: its Leases and
// the StatefulSet. Not an informer of controller-runtime's cache: an
// informer's reflector retries a failed list or watch after a backoff that
// grows to 30–60 s (client-go's default, for collections whose relist is
// costly), so after an API server outage of more than a minute a replica's
// view of the ring could stay stale that long after the server answered
// again. In the scale scenario's restart at 100,000 objects (docs/scale.md,
// 44d9f1d) one replica of eight renewed its member Lease 4 s after the
// server answered, but saw it renewed 79 s later, and claimed none of its
// shards meanwhile; the other seven, whose retries happened to come sooner,
// held theirs at once. These objects are a few dozen: a retry every
// RetryPeriod at most costs nothing.

// objectWatch keeps a store of what its reflector lists and watches, and calls
// changed on every change: old nil for an object added (or listed again),
// new nil for one deleted, both nil for a relist that found none.
type objectWatch struct {
	toolscache.Store
	changed func(old, new any)
	synced  chan struct{}
	once    sync.Once
}

// startWatch runs a reflector of lw into a new objectWatch until ctx ends, and
// retries a failed list or watch after 100 ms, doubling to at most retry.
// done is closed when the reflector returned.
func startWatch(ctx context.Context, name string, lw toolscache.ListerWatcher, expected runtime.Object, retry time.Duration, changed func(old, new any)) (w *objectWatch, done <-chan struct{}) {
	w = &objectWatch{Store: toolscache.NewStore(toolscache.MetaNamespaceKeyFunc), changed: changed, synced: make(chan struct{})}
	r := toolscache.NewReflectorWithOptions(lw, expected, w, toolscache.ReflectorOptions{
		Name:    name,
		Backoff: backoff.Policy{Initial: min(100*time.Millisecond, retry), Max: retry, Jitter: 0.2}.Wait(),
	})
	finished := make(chan struct{})
	go func() { defer close(finished); r.RunWithContext(ctx) }()
	return w, finished
}

// waitForSync waits until the first list is in the store, and reports
// false when ctx ended first.
func (w *objectWatch) waitForSync(ctx context.Context) bool {
	select {
	case <-w.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

// Add, Update, Delete, Replace and Resync make an objectWatch the reflector's
// store.

func (w *objectWatch) Add(obj any) error {
	if err := w.Store.Add(obj); err != nil {
		return err
	}
	w.changed(nil, obj)
	return nil
}

func (w *objectWatch) Update(obj any) error {
	old, _, err := w.Get(obj)
	if err != nil {
		return err
	}
	if err := w.Store.Update(obj); err != nil {
		return err
	}
	w.changed(old, obj)
	return nil
}

func (w *objectWatch) Delete(obj any) error {
	if err := w.Store.Delete(obj); err != nil {
		return err
	}
	w.changed(obj, nil)
	return nil
}

func (w *objectWatch) Replace(list []any, resourceVersion string) error {
	if err := w.Store.Replace(list, resourceVersion); err != nil {
		return err
	}
	w.once.Do(func() { close(w.synced) })
	if len(list) == 0 {
		w.changed(nil, nil)
	}
	for _, obj := range list {
		w.changed(nil, obj)
	}
	return nil
}

func (w *objectWatch) Resync() error { return nil }
