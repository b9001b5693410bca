package sharding

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// group is one informer cache for a set of shards this replica acquired
// together: its informers select `kshard.dev/shard in (set)`. The API
// server's watch cache has no label index, so every LIST scans the whole
// collection whatever its selector: one cache per acquisition, not per
// shard, is what keeps a fleet's list cost near one scan per replica. Shards
// leave a group one by one as they are released; the group stops when none
// reads it any more, and the coordinator rebuilds it smaller (compact) when
// it caches mostly shards this replica no longer holds.
type group struct {
	r      *Replica
	shards []int32 // the selector's set, sorted
	cache  cache.Cache
	ctx    context.Context // the cache's lifetime
	stop   context.CancelFunc
	done   chan struct{} // closed when the cache stopped
	synced chan struct{} // closed when its informers synced

	mu         sync.Mutex
	started    bool
	compacting bool
	members    int             // shards that read this group
	counts     map[int32]int64 // primary objects cached, per shard
}

// stripThen strips managed fields, then runs a kind's own transform: a
// kind's transform replaces the cache's default one.
func stripThen(t toolscache.TransformFunc) toolscache.TransformFunc {
	strip := cache.TransformStripManagedFields()
	return func(obj any) (any, error) {
		obj, err := strip(obj)
		if err != nil {
			return nil, err
		}
		return t(obj)
	}
}

// newGroup creates (but does not start) the cache of a set of shards: the
// primary and owned kinds, without managed fields, with the ring's indexes
// and event handlers that hand each event to the shard it belongs to.
func (r *Replica) newGroup(ctx context.Context, shards []int32) (_ *group, err error) {
	slices.Sort(shards)
	sel, err := r.keys.shardSelector(selection.In, shards...)
	if err != nil {
		return nil, err
	}
	mgr := r.mgr
	var syncPeriod *time.Duration
	if r.opts.SyncPeriod > 0 {
		syncPeriod = &r.opts.SyncPeriod
	}
	byObject := map[client.Object]cache.ByObject{}
	for _, k := range append([]Kind{r.opts.For}, r.opts.Owns...) {
		var by cache.ByObject
		if k.Transform != nil {
			by.Transform = stripThen(k.Transform)
		}
		if k.Selector != nil {
			reqs, _ := k.Selector.Requirements()
			by.Label = sel.DeepCopySelector().Add(reqs...)
		}
		if by.Transform != nil || by.Label != nil {
			byObject[k.Object] = by
		}
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		ByObject:                    byObject,
		SyncPeriod:                  syncPeriod,
		DefaultNamespaces:           r.namespaces(),
		HTTPClient:                  mgr.GetHTTPClient(),
		Scheme:                      mgr.GetScheme(),
		Mapper:                      mgr.GetRESTMapper(),
		DefaultLabelSelector:        sel,
		DefaultTransform:            cache.TransformStripManagedFields(),
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the cache of shards %v: %w", shards, err)
	}
	g := &group{r: r, shards: shards, cache: c, done: make(chan struct{}), synced: make(chan struct{}), counts: map[int32]int64{}}
	g.ctx, g.stop = context.WithCancel(ctx)
	defer func() {
		if err != nil {
			g.stop()
		}
	}()
	ctx = g.ctx
	for _, ix := range r.opts.Indexes {
		if err := c.IndexField(ctx, ix.Object, ix.Field, ix.Extract); err != nil {
			return nil, fmt.Errorf("indexing %T by %s: %w", ix.Object, ix.Field, err)
		}
	}
	handlers := []struct {
		obj client.Object
		h   toolscache.ResourceEventHandler
	}{{r.opts.For.Object, g.primaryHandler()}}
	for _, k := range r.opts.Owns {
		handlers = append(handlers, struct {
			obj client.Object
			h   toolscache.ResourceEventHandler
		}{k.Object, g.ownedHandler(k)})
	}
	for _, h := range handlers {
		inf, err := c.GetInformer(ctx, h.obj)
		if err != nil {
			return nil, fmt.Errorf("creating the informer of %T: %w", h.obj, err)
		}
		if _, err := inf.AddEventHandler(h.h); err != nil {
			return nil, fmt.Errorf("adding the event handler of %T: %w", h.obj, err)
		}
	}
	return g, nil
}

// start runs the cache until the group is stopped, and closes synced when
// its informers have synced.
func (g *group) start() {
	ctx := g.ctx
	g.mu.Lock()
	g.started = true
	g.mu.Unlock()
	go func() {
		defer close(g.done)
		if err := g.cache.Start(ctx); err != nil {
			g.r.log.Error(err, "Shard cache stopped", "shards", g.shards)
		}
	}()
	go func() {
		if g.cache.WaitForCacheSync(ctx) {
			close(g.synced)
		}
	}()
}

func (g *group) isSynced() bool {
	select {
	case <-g.synced:
		return true
	default:
		return false
	}
}

// join counts a shard that reads this group.
func (g *group) join() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members++
}

// leave uncounts a shard, and stops the cache when none is left.
func (g *group) leave() {
	g.mu.Lock()
	g.members--
	last, started := g.members == 0, g.started
	g.mu.Unlock()
	if !last {
		return
	}
	g.stop()
	if started {
		<-g.done
	}
	g.r.mu.Lock()
	delete(g.r.groups, g)
	g.r.mu.Unlock()
}

// endCompaction lets a failed compaction be tried again.
func (g *group) endCompaction() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.compacting = false
}

// beginCompaction claims the group's one compaction.
func (g *group) beginCompaction() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.compacting {
		return false
	}
	g.compacting = true
	return true
}

// wasteful reports whether most of what the group caches belongs to shards
// this replica no longer holds: worth one more LIST to shed.
func (g *group) wasteful() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.members > 0 && len(g.shards) >= 2*g.members
}

// count adds delta to a shard's cached objects and returns the new count.
func (g *group) count(n int32, delta int64) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.counts[n] += delta
	return g.counts[n]
}

// owner returns the runtime of the shard an object belongs to, when that
// shard reads this group; objects of shards released since the group was
// built are ignored.
func (g *group) owner(o client.Object) (*shard, int32, bool) {
	n, ok := g.r.keys.shardOf(o.GetLabels(), g.r.opts.Shards)
	if !ok {
		return nil, 0, false
	}
	s := g.r.shard(n)
	if s == nil || !s.reads(g) {
		return nil, n, false
	}
	return s, n, true
}

// shardReader reads one shard's objects from its group's cache: a Get of an
// object of another shard is NotFound, as it would be in a cache of that
// shard alone, and a List selects the shard's label.
type shardReader struct {
	c      client.Reader
	key    string // the shard label's key
	shard  string
	scheme *runtime.Scheme
}

func (sr shardReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := sr.c.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if obj.GetLabels()[sr.key] == sr.shard {
		return nil
	}
	gvk, err := apiutil.GVKForObject(obj, sr.scheme)
	if err != nil {
		return err
	}
	return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: gvk.Kind}, key.Name)
}

func (sr shardReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	req, err := labels.NewRequirement(sr.key, selection.Equals, []string{sr.shard})
	if err != nil {
		return err
	}
	sel := labels.NewSelector()
	if lo.LabelSelector != nil {
		sel = lo.LabelSelector.DeepCopySelector()
	}
	lo.LabelSelector = sel.Add(*req)
	return sr.c.List(ctx, list, lo)
}

// joinBatch adds a shard whose Lease was just acquired to the open batch,
// opening one if needed. A batch closes, and its group starts, when every
// shard the ring gives this replica is held or in the batch, or
// BatchWindow after it opened, whichever comes first: a handover releases
// a replica's shards within moments of each other, so the incoming replica
// lists them once.
func (r *Replica) joinBatch(ctx context.Context, s *shard) {
	r.mu.Lock()
	b := r.open
	switch {
	case b == nil:
		b = &batch{opened: time.Now()}
		r.open = b
		b.timer = time.AfterFunc(r.opts.BatchWindow, func() { r.closeBatch(ctx, b) })
	case time.Since(b.opened) < maxBatchWait*r.opts.BatchWindow:
		// Acquisitions still arrive: wait for the rest, as a slow API
		// server (a loaded machine, a fleet starting together) acquires 64
		// shards over seconds, and each cache closed early is one more
		// scan of the whole collection.
		b.timer.Reset(r.opts.BatchWindow)
	}
	b.shards = append(b.shards, s)
	complete := r.batchCompleteLocked()
	r.mu.Unlock()
	if complete {
		r.closeBatch(ctx, b)
	}
}

// maxBatchWait bounds, in BatchWindows from its first shard, how long a
// batch keeps waiting for more: the first shard runs at the latest then.
const maxBatchWait = 10

// batchCompleteLocked reports whether every shard the ring gives this
// replica has passed acquisition. Caller holds r.mu.
func (r *Replica) batchCompleteLocked() bool {
	for _, n := range r.ring.ShardsOf(r.opts.Identity) {
		s, ok := r.shards[n]
		if !ok || s.is(stateAcquiring) {
			return false
		}
	}
	return true
}

// unbatch takes a stopped shard out of the open batch.
func (r *Replica) unbatch(s *shard) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.open != nil {
		r.open.shards = slices.DeleteFunc(r.open.shards, func(x *shard) bool { return x == s })
	}
}

// closeBatch closes batch b, if still open, and starts its group.
func (r *Replica) closeBatch(ctx context.Context, b *batch) {
	r.mu.Lock()
	if r.open != b {
		r.mu.Unlock()
		return
	}
	r.open = nil
	shards := slices.Clone(b.shards)
	r.mu.Unlock()
	if len(shards) > 0 {
		go r.startGroup(ctx, shards)
	}
}

// startGroup creates and starts the cache of a closed batch, once the
// controller's queue exists, and activates its shards.
func (r *Replica) startGroup(ctx context.Context, shards []*shard) {
	select {
	case <-r.queueReady:
	case <-ctx.Done():
		return
	}
	ids := make([]int32, len(shards))
	for i, s := range shards {
		ids[i] = s.id
	}
	cacheCtx := context.WithoutCancel(ctx)
	g, err := r.newGroup(cacheCtx, ids)
	if err != nil {
		r.log.Error(err, "Creating the cache of acquired shards; releasing them", "shards", ids)
		for _, s := range shards {
			s.release("cache failed")
		}
		return
	}
	// Every shard counts as a member until activated, so that one released
	// meanwhile cannot stop the cache under the others.
	g.members = len(shards)
	r.mu.Lock()
	r.groups[g] = true
	r.mu.Unlock()
	var running []*shard
	for _, s := range shards {
		if s.activate(g) {
			running = append(running, s)
		}
	}
	for _, s := range running {
		s.beginTenure()
	}
	r.metrics.caches.WithLabelValues("acquisition").Inc()
	g.start()
	for range shards {
		g.leave()
	}
	r.log.V(1).Info("Started shard cache", "shards", ids, "running", len(running))
	go func() {
		select {
		case <-g.synced:
		case <-g.done:
			return
		}
		for _, s := range running {
			if s.reads(g) {
				s.onSynced()
			}
		}
	}()
}

// compactLocked rebuilds, smaller, every group that caches mostly shards
// this replica no longer holds, once the replica holds exactly what the
// ring gives it (no acquisition or release under way, so the rebuild is
// not immediately wasted). Caller holds r.mu.
func (r *Replica) compactLocked(ctx context.Context, ring *Ring) {
	if r.open != nil {
		return
	}
	desired := ring.ShardsOf(r.opts.Identity)
	if len(desired) != len(r.shards) {
		return
	}
	for _, n := range desired {
		if s, ok := r.shards[n]; !ok || !s.synced() {
			return
		}
	}
	for g := range r.groups {
		if g.wasteful() && g.beginCompaction() {
			var members []*shard
			for _, s := range r.shards {
				if s.reads(g) {
					members = append(members, s)
				}
			}
			go r.compact(context.WithoutCancel(ctx), g, members)
		}
	}
}

// compact moves the shards of group old to a new group of just their
// shards: the new cache syncs while the old one still serves them, then
// each shard switches, and every object of the switched shards is enqueued
// once, for the events that arrived between the two caches' views.
func (r *Replica) compact(ctx context.Context, old *group, members []*shard) {
	ids := make([]int32, len(members))
	for i, s := range members {
		ids[i] = s.id
	}
	g, err := r.newGroup(ctx, ids)
	if err != nil {
		r.log.Error(err, "Compacting a shard cache; trying again later", "shards", ids)
		old.endCompaction()
		return
	}
	g.members = 1 // the compaction itself, until the switch
	r.metrics.caches.WithLabelValues("compaction").Inc()
	g.start()
	select {
	case <-g.synced:
	case <-g.done:
		old.endCompaction()
		return
	}
	r.mu.Lock()
	r.groups[g] = true
	r.mu.Unlock()
	var switched []*shard
	for _, s := range members {
		if s.regroup(old, g) {
			switched = append(switched, s)
			old.leave()
		}
	}
	r.log.V(1).Info("Compacted a shard cache", "from", old.shards, "to", ids, "switched", len(switched))
	for _, s := range switched {
		r.metrics.objects.WithLabelValues(s.name).Set(float64(g.count(s.id, 0)))
		r.enqueueAll(ctx, s, g)
	}
	g.leave()
}

// enqueueAll enqueues every primary object of shard s in group g, at low
// priority.
func (r *Replica) enqueueAll(ctx context.Context, s *shard, g *group) {
	obj, err := r.mgr.GetScheme().New(r.forGVK.GroupVersion().WithKind(r.forGVK.Kind + "List"))
	list, ok := obj.(client.ObjectList)
	if err != nil || !ok {
		r.log.Error(err, "Listing a compacted shard: no list kind", "kind", r.forGVK)
		return
	}
	if err := s.reader(g).List(ctx, list); err != nil {
		r.log.Error(err, "Listing a compacted shard", "shard", s.id)
		return
	}
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		if co, ok := o.(client.Object); ok {
			s.enqueue(client.ObjectKeyFromObject(co), true)
		}
		return nil
	})
}
