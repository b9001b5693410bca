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

	"github.com/kshard/kshard/sharding/ring"
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
	c      *coordinator
	shards []int32 // the selector's set, sorted
	cache  cache.Cache
	ctx    context.Context // the cache's lifetime
	stop   context.CancelFunc
	done   chan struct{} // closed when the cache stopped
	synced chan struct{} // closed when its informers synced

	mu         sync.Mutex
	started    bool
	compacting bool
	// warming: the cache of a warm-up, whose shards this replica does not
	// hold yet; not compacted until the warm-up ends.
	warming bool
	members int             // shards that read this group
	counts  map[int32]int64 // primary objects cached, per shard
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
func (c *coordinator) newGroup(ctx context.Context, shards []int32) (_ *group, err error) {
	slices.Sort(shards)
	sel, err := c.keys.shardSelector(selection.In, shards...)
	if err != nil {
		return nil, err
	}
	mgr := c.mgr
	var syncPeriod *time.Duration
	if c.opts.SyncPeriod > 0 {
		syncPeriod = &c.opts.SyncPeriod
	}
	byObject := map[client.Object]cache.ByObject{}
	for _, k := range append([]Kind{c.opts.For}, c.opts.Owns...) {
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
	informers, err := cache.New(mgr.GetConfig(), cache.Options{
		ByObject:                    byObject,
		SyncPeriod:                  syncPeriod,
		DefaultNamespaces:           c.namespaces(),
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
	g := &group{c: c, shards: shards, cache: informers, done: make(chan struct{}), synced: make(chan struct{}), counts: map[int32]int64{}}
	g.ctx, g.stop = context.WithCancel(ctx)
	defer func() {
		if err != nil {
			g.stop()
		}
	}()
	ctx = g.ctx
	for _, ix := range c.opts.Indexes {
		if err := informers.IndexField(ctx, ix.Object, ix.Field, ix.Extract); err != nil {
			return nil, fmt.Errorf("indexing %T by %s: %w", ix.Object, ix.Field, err)
		}
	}
	handlers := []struct {
		obj client.Object
		h   toolscache.ResourceEventHandler
	}{{c.opts.For.Object, g.primaryHandler()}}
	for _, k := range c.opts.Owns {
		handlers = append(handlers, struct {
			obj client.Object
			h   toolscache.ResourceEventHandler
		}{k.Object, g.ownedHandler(k)})
	}
	for _, h := range handlers {
		inf, err := informers.GetInformer(ctx, h.obj)
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
			g.c.log.Error(err, "Shard cache stopped", "shards", g.shards)
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

// tryJoin counts a shard that reads this group, unless its last member has
// left (it stops, or has stopped).
func (g *group) tryJoin() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.members == 0 {
		return false
	}
	g.members++
	return true
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
	g.c.mu.Lock()
	delete(g.c.groups, g)
	g.c.mu.Unlock()
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
	return !g.warming && g.members > 0 && len(g.shards) >= 2*g.members
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
	n, ok := g.c.keys.ShardLabel(o.GetLabels(), g.c.opts.Shards)
	if !ok {
		return nil, 0, false
	}
	s := g.c.shard(n)
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

// batch gathers the shards whose Leases this replica acquires close
// together, so that they share one group: one LIST and one watch per kind
// for all of them.
type batch struct {
	shards []*shard
	// opened is when its first shard joined; timer closes it BatchWindow
	// after the last join, at most maxBatchWait after opened.
	opened time.Time
	timer  *time.Timer
}

// joinBatch adds a shard whose Lease was just acquired to the open batch,
// opening one if needed. A batch closes, and its group starts, when every
// shard the ring gives this replica is held or in the batch, or
// BatchWindow after it opened, whichever comes first: a handover releases
// a replica's shards within moments of each other, so the incoming replica
// lists them once.
func (c *coordinator) joinBatch(ctx context.Context, s *shard) {
	if c.rejoin(ctx, s) {
		return
	}
	c.mu.Lock()
	b := c.open
	switch {
	case b == nil:
		b = &batch{opened: time.Now()}
		c.open = b
		b.timer = time.AfterFunc(c.opts.BatchWindow, func() { c.closeBatch(ctx, b) })
	case time.Since(b.opened) < maxBatchWait*c.opts.BatchWindow:
		// Acquisitions still arrive: wait for the rest, as a slow API
		// server (a loaded machine, a fleet starting together) acquires 64
		// shards over seconds, and each cache closed early is one more
		// scan of the whole collection.
		b.timer.Reset(c.opts.BatchWindow)
	}
	b.shards = append(b.shards, s)
	complete := c.batchCompleteLocked()
	c.mu.Unlock()
	if complete {
		c.closeBatch(ctx, b)
	}
}

// rejoin activates a shard just acquired in a running, synced group whose
// selector still covers it: a shard this replica held moments ago, fenced
// (its renewal missed the renew deadline) or released, and took again. Its
// tenure starts without another LIST, which would scan the whole collection
// in the API server: renewals miss their deadline when the server is
// overloaded (a restart under load at 100,000 objects, docs/scale.md), and
// a relist for each such shard loads it further. Events of the shard's
// objects that came while it was not the group's were dropped, so each of
// its objects is enqueued once.
func (c *coordinator) rejoin(ctx context.Context, s *shard) bool {
	var g *group
	c.mu.Lock()
	for _, candidate := range c.rejoinCandidatesLocked(s.id) {
		if candidate.tryJoin() {
			g = candidate
			break
		}
	}
	c.mu.Unlock()
	if g == nil {
		return false
	}
	// tryJoin's count holds the cache until the shard has joined it.
	defer g.leave()
	if !s.activate(g) {
		return true
	}
	s.beginTenure()
	s.onSynced()
	c.metrics.objects.WithLabelValues(s.name).Set(float64(g.count(s.id, 0)))
	c.log.V(1).Info("Shard rejoined a running cache", "shard", s.id, "cache", g.shards)
	c.enqueueAll(ctx, s, g)
	return true
}

// rejoinCandidatesLocked lists the running, synced groups whose selector
// covers shard n, fewest shards first. A warm-up's cache is exactly the
// shards a leaving replica hands over, and an older cache of this replica
// may cover them too (one it started when it held every shard): each shard
// taken joins the warm-up's, so that cache stays whole instead of being
// compacted, with one more LIST, to the shards that happened to pick it.
// Caller holds c.mu.
func (c *coordinator) rejoinCandidatesLocked(n int32) []*group {
	var out []*group
	for g := range c.groups {
		if slices.Contains(g.shards, n) && g.isSynced() {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b *group) int { return len(a.shards) - len(b.shards) })
	return out
}

// maxBatchWait bounds, in BatchWindows from its first shard, how long a
// batch keeps waiting for more: the first shard runs at the latest then.
const maxBatchWait = 10

// batchCompleteLocked reports whether every shard the ring gives this
// replica has passed acquisition. Caller holds c.mu.
func (c *coordinator) batchCompleteLocked() bool {
	for _, n := range c.ring.ShardsOf(c.opts.Identity) {
		s, ok := c.shards[n]
		if !ok || s.is(stateAcquiring) {
			return false
		}
	}
	return true
}

// unbatch takes a stopped shard out of the open batch.
func (c *coordinator) unbatch(s *shard) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open != nil {
		c.open.shards = slices.DeleteFunc(c.open.shards, func(x *shard) bool { return x == s })
	}
}

// closeBatch closes batch b, if still open, and starts its group.
func (c *coordinator) closeBatch(ctx context.Context, b *batch) {
	c.mu.Lock()
	if c.open != b {
		c.mu.Unlock()
		return
	}
	c.open = nil
	shards := slices.Clone(b.shards)
	c.mu.Unlock()
	if len(shards) > 0 {
		go c.startGroup(ctx, shards)
	}
}

// startGroup creates and starts the cache of a closed batch, once the
// controller's queue exists, and activates its shards.
func (c *coordinator) startGroup(ctx context.Context, shards []*shard) {
	select {
	case <-c.queue.ready:
	case <-ctx.Done():
		return
	}
	ids := make([]int32, len(shards))
	for i, s := range shards {
		ids[i] = s.id
	}
	cacheCtx := context.WithoutCancel(ctx)
	g, err := c.newGroup(cacheCtx, ids)
	if err != nil {
		c.log.Error(err, "Creating the cache of acquired shards; releasing them", "shards", ids)
		for _, s := range shards {
			s.release("cache failed")
		}
		return
	}
	// Every shard counts as a member until activated, so that one released
	// meanwhile cannot stop the cache under the others.
	g.members = len(shards)
	c.mu.Lock()
	c.groups[g] = true
	c.mu.Unlock()
	var running []*shard
	for _, s := range shards {
		if s.activate(g) {
			running = append(running, s)
		}
	}
	for _, s := range running {
		s.beginTenure()
	}
	c.metrics.caches.WithLabelValues("acquisition").Inc()
	g.start()
	for range shards {
		g.leave()
	}
	c.log.V(1).Info("Started shard cache", "shards", ids, "running", len(running))
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
// not immediately wasted). Caller holds c.mu.
func (c *coordinator) compactLocked(ctx context.Context, current *ring.Ring) {
	if c.open != nil {
		return
	}
	desired := current.ShardsOf(c.opts.Identity)
	if len(desired) != len(c.shards) {
		return
	}
	for _, n := range desired {
		if s, ok := c.shards[n]; !ok || !s.synced() {
			return
		}
	}
	for g := range c.groups {
		if g.wasteful() && g.beginCompaction() {
			var members []*shard
			for _, s := range c.shards {
				if s.reads(g) {
					members = append(members, s)
				}
			}
			go c.compact(context.WithoutCancel(ctx), g, members)
		}
	}
}

// compact moves the shards of group old to a new group of just their
// shards: the new cache syncs while the old one still serves them, then
// each shard switches, and every object of the switched shards is enqueued
// once, for the events that arrived between the two caches' views.
func (c *coordinator) compact(ctx context.Context, old *group, members []*shard) {
	ids := make([]int32, len(members))
	for i, s := range members {
		ids[i] = s.id
	}
	g, err := c.newGroup(ctx, ids)
	if err != nil {
		c.log.Error(err, "Compacting a shard cache; trying again later", "shards", ids)
		old.endCompaction()
		return
	}
	g.members = 1 // the compaction itself, until the switch
	c.metrics.caches.WithLabelValues("compaction").Inc()
	g.start()
	select {
	case <-g.synced:
	case <-g.done:
		old.endCompaction()
		return
	}
	c.mu.Lock()
	c.groups[g] = true
	c.mu.Unlock()
	var switched []*shard
	for _, s := range members {
		if s.regroup(old, g) {
			switched = append(switched, s)
			old.leave()
		}
	}
	c.log.V(1).Info("Compacted a shard cache", "from", old.shards, "to", ids, "switched", len(switched))
	for _, s := range switched {
		c.metrics.objects.WithLabelValues(s.name).Set(float64(g.count(s.id, 0)))
		c.enqueueAll(ctx, s, g)
	}
	g.leave()
}

// enqueueAll enqueues every primary object of shard s in group g, at low
// priority.
func (c *coordinator) enqueueAll(ctx context.Context, s *shard, g *group) {
	obj, err := c.mgr.GetScheme().New(c.forGVK.GroupVersion().WithKind(c.forGVK.Kind + "List"))
	list, ok := obj.(client.ObjectList)
	if err != nil || !ok {
		c.log.Error(err, "Listing a compacted shard: no list kind", "kind", c.forGVK)
		return
	}
	if err := s.reader(g).List(ctx, list); err != nil {
		c.log.Error(err, "Listing a compacted shard", "shard", s.id)
		return
	}
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		if co, ok := o.(client.Object); ok {
			s.enqueue(client.ObjectKeyFromObject(co), true)
		}
		return nil
	})
}
