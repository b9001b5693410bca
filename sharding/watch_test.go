package sharding

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// failingLister fails its first lists, as an API server that is away
// refuses them, then lists one Lease and watches nothing.
type failingLister struct {
	mu       sync.Mutex
	failures int
	lists    int
}

func (f *failingLister) List(metav1.ListOptions) (runtime.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if f.lists <= f.failures {
		return nil, errors.New("connect: connection refused")
	}
	return &coordinationv1.LeaseList{ListMeta: metav1.ListMeta{ResourceVersion: "1"},
		Items: []coordinationv1.Lease{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "l", ResourceVersion: "1"}}}}, nil
}

func (f *failingLister) Watch(metav1.ListOptions) (watch.Interface, error) {
	return watch.NewFake(), nil
}

// IsWatchListSemanticsUnSupported: the reflector lists, as it does when
// an API server does not stream lists.
func (f *failingLister) IsWatchListSemanticsUnSupported() bool { return true }

var _ toolscache.ListerWatcher = &failingLister{}

// TestWatchRetriesWithinRetryPeriod: a watch of the ring's Leases lists
// again within its retry period after each failure, however many came
// before: after eight failed lists (an API server away), the ninth comes at
// once. client-go's default backoff grows to 30–60 s and would space those
// eight over at least 110 s; the bound here, 30 s, is far from both.
func TestWatchRetriesWithinRetryPeriod(t *testing.T) {
	lw := &failingLister{failures: 8}
	ctx, cancel := context.WithCancel(context.Background())
	w, done := startWatch(ctx, "test", lw, &coordinationv1.Lease{}, 20*time.Millisecond, func(_, _ any) {})
	defer func() { cancel(); <-done }()
	waitCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	if !w.waitForSync(waitCtx) {
		lw.mu.Lock()
		defer lw.mu.Unlock()
		t.Fatalf("not synced 30 s after the start: %d lists, the first %d failing", lw.lists, lw.failures)
	}
	if got := len(w.List()); got != 1 {
		t.Errorf("the store holds %d objects, want 1", got)
	}
}
