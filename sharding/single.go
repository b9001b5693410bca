package sharding

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	crsource "sigs.k8s.io/controller-runtime/pkg/source"
)

// Single runs every shard in one replica: the classic single active replica
// (the manager's leader election, one cache of every object), with the
// Requests, hooks and write check of a Replica, so that a controller is
// wired one way whether it is sharded or not. It is what runs with sharding
// off, the baseline that sharding is measured against, and a stand-in for a
// Replica in an embedder's tests.
//
// A Single is a manager.Runnable that needs leader election: once elected it
// runs OnAcquire for every shard, its context ending when the manager stops;
// reconciles wait for that. Writes are granted from the election on: the
// manager exits when it loses the election.
type Single struct {
	mgr    manager.Manager
	opts   SingleOptions
	forGVK schema.GroupVersionKind
	// starting is set when the manager, elected, starts the Single;
	// acquired is closed once OnAcquire ran for every shard.
	starting atomic.Bool
	acquired chan struct{}

	controller feeds
	mu         sync.Mutex
	queue      workqueue.TypedRateLimitingInterface[Request]
}

// SingleOptions configure a Single.
type SingleOptions struct {
	// Shards is the number of shards objects are spread over, as a ring's
	// (Options.Shards). Default DefaultShards.
	Shards int32
	// Identity names the replica. Defaults to $POD_NAME, else the hostname.
	Identity string
	// LabelPrefix prefixes the label keys of owned objects, as a ring's
	// (Options.LabelPrefix). Default DefaultLabelPrefix.
	LabelPrefix string
	// For is the controller's primary kind. Required. An object's shard is
	// ShardOf(Domain(object), Shards), whatever its shard label says: with
	// sharding off, nothing labels objects.
	For Kind
	// Owns are the other kinds the controller watches, as Options.Owns: an
	// event becomes the request of its controller owner of the For kind, or
	// what the kind's Requests gives. Selector and Transform are the
	// manager's cache's to apply (its ByObject options): a Single has no
	// cache of its own.
	Owns []Kind
	// Domain gives a primary object's domain. Required.
	Domain func(client.Object) string
	// Indexes are added to the manager's cache.
	Indexes []Index
	// OnAcquire runs for every shard once this replica is elected; ctx ends
	// when the manager stops. It must not block.
	OnAcquire func(ctx context.Context, shard int32)
	// OnRelease runs for every shard when the manager stops, after
	// OnAcquire.
	OnRelease func(shard int32)
}

// NewSingle creates a Single and adds it to the manager.
func NewSingle(mgr manager.Manager, opts SingleOptions) (*Single, error) {
	if opts.Shards == 0 {
		opts.Shards = DefaultShards
	}
	if opts.LabelPrefix == "" {
		opts.LabelPrefix = DefaultLabelPrefix
	}
	if err := validateLabelPrefix(opts.LabelPrefix); err != nil {
		return nil, fmt.Errorf("single replica: %w", err)
	}
	id, err := defaultIdentity(opts.Identity)
	if err != nil {
		return nil, err
	}
	opts.Identity = id
	if opts.For.Object == nil || opts.Domain == nil {
		return nil, errors.New("single replica: For.Object and Domain are required")
	}
	gvk, err := apiutil.GVKForObject(opts.For.Object, mgr.GetScheme())
	if err != nil {
		return nil, fmt.Errorf("single replica: the For kind: %w", err)
	}
	for _, ix := range opts.Indexes {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), ix.Object, ix.Field, ix.Extract); err != nil {
			return nil, fmt.Errorf("single replica: indexing %s: %w", ix.Field, err)
		}
	}
	// A shard's reader lists its own objects of the For kind through this
	// index: the manager's cache holds every object, and a List of it
	// copies what it returns, so without the index each shard's List copied
	// the whole collection to keep a shard's share of it (a start warms
	// every shard at once: 64 copies of 100,000 ConfigBindings, 7.7 GB of
	// RSS in the scale scenario).
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), opts.For.Object, singleShardIndex, func(o client.Object) []string {
		return []string{strconv.Itoa(int(ShardOf(opts.Domain(o), opts.Shards)))}
	}); err != nil {
		return nil, fmt.Errorf("single replica: indexing the For kind by shard: %w", err)
	}
	s := &Single{mgr: mgr, opts: opts, forGVK: gvk, acquired: make(chan struct{})}
	if err := mgr.Add(s); err != nil {
		return nil, fmt.Errorf("single replica: %w", err)
	}
	return s, nil
}

// NeedLeaderElection is true: one replica at a time runs the shards.
func (s *Single) NeedLeaderElection() bool { return true }

// Start runs OnAcquire for every shard, waits until ctx ends, then runs
// OnRelease for every shard.
func (s *Single) Start(ctx context.Context) error {
	s.starting.Store(true)
	for n := range s.opts.Shards {
		if s.opts.OnAcquire != nil {
			s.opts.OnAcquire(ctx, n)
		}
	}
	close(s.acquired)
	<-ctx.Done()
	for n := range s.opts.Shards {
		if s.opts.OnRelease != nil {
			s.opts.OnRelease(n)
		}
	}
	return nil
}

// Ready is a readiness check: the elected replica is ready once it has
// started every shard (OnAcquire ran for each); a standby is ready, as it
// stands by (a rolling update waits on its readiness).
func (s *Single) Ready() error {
	if !s.starting.Load() {
		return nil
	}
	select {
	case <-s.acquired:
		return nil
	default:
		return errors.New("elected, shards not started yet")
	}
}

// Leave does nothing: the replica elected next takes every shard when this
// one's manager releases the election.
func (s *Single) Leave(context.Context) {}

// Count is the number of shards.
func (s *Single) Count() int32 { return s.opts.Shards }

// OwnedLabels are the labels of an object created for shard's objects.
func (s *Single) OwnedLabels(shard int32, domain string) map[string]string {
	return newLabelKeys(s.opts.LabelPrefix).owned(shard, domain)
}

// Identity names the replica.
func (s *Single) Identity() string { return s.opts.Identity }

// ShardOf is the shard of a primary object: its domain's.
func (s *Single) ShardOf(o client.Object) int32 { return ShardOf(s.opts.Domain(o), s.opts.Shards) }

// elected reports whether the manager won its election.
func (s *Single) elected() bool {
	select {
	case <-s.mgr.Elected():
		return true
	default:
		return false
	}
}

// Holds reports whether this replica is the elected one.
func (s *Single) Holds(n int32) bool { return n >= 0 && n < s.opts.Shards && s.elected() }

// WriteContext grants writes while this replica is the elected one.
func (s *Single) WriteContext(ctx context.Context, n int32) (context.Context, context.CancelFunc, bool) {
	if !s.Holds(n) {
		noteRefusal(ctx)
		return ctx, func() {}, false
	}
	return ctx, func() {}, true
}

// Reader reads the shard's objects from the manager's cache: a primary
// object is the shard's when its domain is, any other when its shard label
// says so (an object without one is every shard's).
func (s *Single) Reader(n int32) (client.Reader, bool) {
	if n < 0 || n >= s.opts.Shards {
		return nil, false
	}
	return singleReader{s: s, shard: n}, true
}

// WaitForSync waits until the manager's cache has synced.
func (s *Single) WaitForSync(ctx context.Context, n int32) bool {
	if n < 0 || n >= s.opts.Shards {
		return false
	}
	return s.mgr.GetCache().WaitForCacheSync(ctx)
}

// Enqueue requests a reconcile.
func (s *Single) Enqueue(req Request) {
	s.mu.Lock()
	q := s.queue
	s.mu.Unlock()
	if q != nil && req.Shard >= 0 && req.Shard < s.opts.Shards {
		q.Add(req)
	}
}

// isFor reports whether list is a list of the For kind.
func (s *Single) isFor(list client.ObjectList) bool {
	gvk, err := apiutil.GVKForObject(list, s.mgr.GetScheme())
	return err == nil && gvk.GroupVersion() == s.forGVK.GroupVersion() && gvk.Kind == s.forGVK.Kind+"List"
}

// belongs reports whether an object of the manager's cache is shard n's.
func (s *Single) belongs(o client.Object, n int32) bool {
	if gvk, err := apiutil.GVKForObject(o, s.mgr.GetScheme()); err == nil && gvk == s.forGVK {
		return s.ShardOf(o) == n
	}
	if m, ok := newLabelKeys(s.opts.LabelPrefix).ShardLabel(o.GetLabels(), s.opts.Shards); ok {
		return m == n
	}
	return true
}

// NewController creates the controller of a Single: one work queue fed by
// the manager's cache, every object's request carrying its shard, and
// reconciles that wait until OnAcquire ran for every shard. A Single feeds
// one controller: a second call is an error.
func (s *Single) NewController(name string, rec reconcile.TypedReconciler[Request], opts controller.TypedOptions[Request]) (controller.TypedController[Request], error) {
	if err := s.controller.claim(name); err != nil {
		return nil, err
	}
	opts.Reconciler = reconcile.TypedFunc[Request](func(ctx context.Context, req Request) (reconcile.Result, error) {
		select {
		case <-s.acquired:
		case <-ctx.Done():
			return reconcile.Result{}, ctx.Err()
		}
		return rec.Reconcile(ctx, req)
	})
	c, err := controller.NewTyped(name, s.mgr, opts)
	if err != nil {
		return nil, fmt.Errorf("creating controller %s: %w", name, err)
	}
	cache := s.mgr.GetCache()
	primary := func(_ context.Context, o client.Object) []Request {
		return []Request{{Shard: s.ShardOf(o), NamespacedName: client.ObjectKeyFromObject(o)}}
	}
	if err := c.Watch(crsource.TypedKind[client.Object, Request](cache, s.opts.For.Object,
		handler.TypedEnqueueRequestsFromMapFunc(primary), s.opts.For.Predicates...)); err != nil {
		return nil, fmt.Errorf("watching %T: %w", s.opts.For.Object, err)
	}
	for _, k := range s.opts.Owns {
		if err := c.Watch(crsource.TypedKind[client.Object, Request](cache, k.Object,
			handler.TypedFuncs[client.Object, Request]{
				CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[Request]) {
					s.owned(ctx, k, nil, e.Object, q)
				},
				UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[Request]) {
					s.owned(ctx, k, e.ObjectOld, e.ObjectNew, q)
				},
				DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[Request]) {
					s.owned(ctx, k, nil, e.Object, q)
				},
				GenericFunc: func(ctx context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[Request]) {
					s.owned(ctx, k, nil, e.Object, q)
				},
			}, k.Predicates...)); err != nil {
			return nil, fmt.Errorf("watching %T: %w", k.Object, err)
		}
	}
	err = c.Watch(crsource.TypedFunc[Request](func(_ context.Context, q workqueue.TypedRateLimitingInterface[Request]) error {
		s.mu.Lock()
		s.queue = q
		s.mu.Unlock()
		return nil
	}))
	if err != nil {
		return nil, fmt.Errorf("watching the single replica's queue: %w", err)
	}
	return c, nil
}

// owned enqueues the requests of an owned object's event: its controller
// owner of the For kind, or what the kind's Requests gives, each under its
// primary's shard.
func (s *Single) owned(ctx context.Context, k Kind, oldObj, newObj client.Object, q workqueue.TypedRateLimitingInterface[Request]) {
	var keys []types.NamespacedName
	if k.Requests != nil {
		keys = k.Requests(ctx, s.mgr.GetCache(), oldObj, newObj)
	} else if ref := metav1.GetControllerOf(newObj); ref != nil && ref.Kind == s.forGVK.Kind && ref.APIVersion == s.forGVK.GroupVersion().String() {
		keys = []types.NamespacedName{{Namespace: newObj.GetNamespace(), Name: ref.Name}}
	}
	for _, key := range keys {
		o, ok := s.opts.For.Object.DeepCopyObject().(client.Object)
		if !ok {
			return
		}
		if err := s.mgr.GetCache().Get(ctx, key, o); err != nil {
			continue
		}
		q.Add(Request{Shard: s.ShardOf(o), NamespacedName: key})
	}
}

// singleShardIndex is the field index of the For kind's objects by shard in
// a Single's cache.
const singleShardIndex = "sharding.single.shard"

// singleReader reads one shard's objects from a Single's cache of all.
type singleReader struct {
	s     *Single
	shard int32
}

func (r singleReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.s.mgr.GetCache().Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if !r.s.belongs(obj, r.shard) {
		gvk, _ := apiutil.GVKForObject(obj, r.s.mgr.GetScheme())
		return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind}, key.Name)
	}
	return nil
}

func (r singleReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	// The cache selects by one field at most: a List that selects by
	// another (an index of the caller's) is narrowed by it and filtered
	// here; one that does not selects the shard's objects by the index.
	if lo := (&client.ListOptions{}).ApplyOptions(opts); lo.FieldSelector == nil && r.s.isFor(list) {
		opts = append(opts, client.MatchingFields{singleShardIndex: strconv.Itoa(int(r.shard))})
	}
	if err := r.s.mgr.GetCache().List(ctx, list, opts...); err != nil {
		return err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return fmt.Errorf("filtering shard %d's objects: %w", r.shard, err)
	}
	kept := items[:0]
	for _, it := range items {
		if o, ok := it.(client.Object); ok && r.s.belongs(o, r.shard) {
			kept = append(kept, it)
		}
	}
	return meta.SetList(list, kept)
}
