package sharding_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/sharding"
)

// singleRecorder records what a controller on a Single sees: each request,
// whether the request's shard reads its object and another shard does not,
// and whether writes were granted; it owns a ConfigMap per binding.
type singleRecorder struct {
	single *sharding.Single
	c      client.Client
	mu     sync.Mutex
	seen   map[sharding.Request]int
	errs   []string
}

func (r *singleRecorder) Reconcile(ctx context.Context, req sharding.Request) (reconcile.Result, error) {
	r.mu.Lock()
	r.seen[req]++
	r.mu.Unlock()
	fail := func(format string, args ...any) {
		r.mu.Lock()
		r.errs = append(r.errs, fmt.Sprintf("%s: ", req)+fmt.Sprintf(format, args...))
		r.mu.Unlock()
	}
	reader, ok := r.single.Reader(req.Shard)
	if !ok {
		fail("no reader for the request's shard")
		return reconcile.Result{}, nil
	}
	var cb configv1alpha1.ConfigBinding
	if err := reader.Get(ctx, req.NamespacedName, &cb); err != nil {
		fail("the request's shard does not read its object: %v", err)
		return reconcile.Result{}, nil
	}
	if want := sharding.ShardOf(cb.Spec.Domain, r.single.Count()); req.Shard != want {
		fail("request under shard %d, its domain's is %d", req.Shard, want)
	}
	other, _ := r.single.Reader((req.Shard + 1) % r.single.Count())
	if err := other.Get(ctx, req.NamespacedName, &configv1alpha1.ConfigBinding{}); !apierrors.IsNotFound(err) {
		fail("another shard reads the object: %v", err)
	}
	var list configv1alpha1.ConfigBindingList
	if err := other.List(ctx, &list, client.InNamespace(req.Namespace)); err != nil {
		fail("listing another shard: %v", err)
	}
	for _, o := range list.Items {
		if o.Name == req.Name {
			fail("another shard lists the object")
		}
	}
	wctx, done, ok := r.single.WriteContext(ctx, req.Shard)
	defer done()
	if !ok {
		fail("write refused to the elected single replica")
		return reconcile.Result{}, nil
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cb.Namespace, Name: cb.Spec.Target.ConfigMapName}}
	_, err := controllerutil.CreateOrUpdate(wctx, r.c, cm, func() error {
		return controllerutil.SetControllerReference(&cb, cm, r.c.Scheme())
	})
	return reconcile.Result{}, err
}

// listCounter is a manager's cache that counts the objects returned by the
// Lists whose context is marked counted: what a reader built on it made
// the cache copy (the controller's own Lists, concurrent, are not marked).
type listCounter struct {
	cache.Cache
	listed atomic.Int64
}

type counted struct{}

func (c *listCounter) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	err := c.Cache.List(ctx, list, opts...)
	if err == nil && ctx.Value(counted{}) != nil {
		c.listed.Add(int64(meta.LenList(list)))
	}
	return err
}

func (r *singleRecorder) count(req sharding.Request) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[req]
}

// TestSingleRunsEveryShard: a Single, elected, runs OnAcquire for every
// shard with a context that ends when the manager stops, before OnRelease
// for every shard; its controller's requests carry each object's domain's
// shard, whose reader reads it and no other's does; writes are granted; an
// owned object's event becomes its owner's request under the owner's shard;
// a shard's List has the cache copy that shard's objects only, not every
// object of the kind. Its readiness: ready as a standby (not elected yet),
// not while it starts its shards, ready once it runs them.
func TestSingleRunsEveryShard(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	ns := newNamespace(t, c)
	const shards = 8
	counter := &listCounter{}
	mgr, err := ctrl.NewManager(cp.Config, manager.Options{
		NewCache: func(cfg *rest.Config, o cache.Options) (cache.Cache, error) {
			inner, err := cache.New(cfg, o)
			counter.Cache = inner
			return counter, err
		},
		Scheme:                        newScheme(),
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		Controller:                    config.Controller{SkipNameValidation: ptr.To(true)},
		Cache:                         cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		LeaderElection:                true,
		LeaderElectionID:              "single",
		LeaderElectionNamespace:       ns,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var single *sharding.Single
	acquired := map[int32]context.Context{}
	released := map[int32]bool{}
	single, err = sharding.NewSingle(mgr, sharding.SingleOptions{
		Shards:   shards,
		Identity: "single-0",
		For:      sharding.Kind{Object: &configv1alpha1.ConfigBinding{}},
		Owns:     []sharding.Kind{{Object: &corev1.ConfigMap{}}},
		Domain:   func(o client.Object) string { return o.(*configv1alpha1.ConfigBinding).Spec.Domain },
		OnAcquire: func(ctx context.Context, n int32) {
			mu.Lock()
			defer mu.Unlock()
			if single.Ready() == nil {
				t.Errorf("ready while starting shard %d", n)
			}
			acquired[n] = ctx
		},
		OnRelease: func(n int32) {
			mu.Lock()
			defer mu.Unlock()
			if ctx := acquired[n]; ctx == nil || ctx.Err() == nil {
				t.Errorf("shard %d released before its tenure's context ended", n)
			}
			released[n] = true
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := &singleRecorder{single: single, c: mgr.GetClient(), seen: map[sharding.Request]int{}}
	if _, err := single.NewController("single", rec, controller.TypedOptions[sharding.Request]{MaxConcurrentReconciles: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := single.NewController("again", rec, controller.TypedOptions[sharding.Request]{}); err == nil {
		t.Error("a second controller on one Single was accepted")
	}
	if err := single.Ready(); err != nil {
		t.Errorf("a standby is not ready: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-stopped
	})

	keys := createBindings(t, c, ns, 40, 13)
	requestOf := func(k client.ObjectKey) sharding.Request {
		var cb configv1alpha1.ConfigBinding
		if err := c.Get(context.Background(), k, &cb); err != nil {
			t.Fatal(err)
		}
		return sharding.Request{Shard: sharding.ShardOf(cb.Spec.Domain, shards), NamespacedName: k}
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		for _, k := range keys {
			if rec.count(requestOf(k)) == 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("not every binding reconciled under its domain's shard: %v", err)
	}
	for n := range int32(shards) {
		if !single.Holds(n) {
			t.Errorf("the elected Single does not hold shard %d", n)
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return single.Ready() == nil, nil
	}); err != nil {
		t.Errorf("the elected Single running every shard is not ready: %v", single.Ready())
	}
	// An owned ConfigMap changed by someone else: its binding is
	// reconciled again, under the binding's shard.
	req := requestOf(keys[0])
	before := rec.count(req)
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cm-0"}, &cm); err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"by": "someone else"}
	if err := c.Update(ctx, &cm); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return rec.count(req) > before, nil
	}); err != nil {
		t.Errorf("a change of its ConfigMap did not requeue %s: %v", req, err)
	}
	// A shard's List of the For kind, with no selector of the caller's:
	// the cache returns that shard's bindings, not all of them.
	for n := range int32(shards) {
		reader, _ := single.Reader(n)
		before := counter.listed.Load()
		var list configv1alpha1.ConfigBindingList
		if err := reader.List(context.WithValue(ctx, counted{}, true), &list); err != nil {
			t.Fatal(err)
		}
		if copied := counter.listed.Load() - before; copied != int64(len(list.Items)) {
			t.Errorf("shard %d's List of its %d bindings had the cache copy %d objects", n, len(list.Items), copied)
		}
	}
	// Enqueue reaches the controller.
	before = rec.count(req)
	single.Enqueue(req)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return rec.count(req) > before, nil
	}); err != nil {
		t.Errorf("Enqueue(%s) did not reach the controller: %v", req, err)
	}

	cancel()
	if err := <-stopped; err != nil {
		t.Errorf("manager: %v", err)
	}
	stopped <- nil
	mu.Lock()
	defer mu.Unlock()
	if len(acquired) != shards || len(released) != shards {
		t.Errorf("OnAcquire ran for %d shards and OnRelease for %d, want %d each", len(acquired), len(released), shards)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, e := range rec.errs {
		t.Error(e)
	}
}
