package sharding

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Request is a reconcile request that carries its shard, so a reconciler
// knows which shard's cache to read and can check that it still holds it.
// The same object in two shards (its label was corrected) is two requests.
type Request struct {
	Shard int32
	types.NamespacedName
}

// String is used in logs.
func (r Request) String() string { return fmt.Sprintf("%d/%s", r.Shard, r.NamespacedName) }

// NewController creates the sharded controller of a Replica: one work queue
// and one bounded set of workers for every shard held, whatever their number,
// fed by the shards' informers. The reconciler runs only while its shard is
// held: a request for a shard being drained or gone is dropped, and a drain
// waits for the shard's in-flight reconciles before the Lease is released.
//
// A Replica feeds one controller: a second call is an error. Give opts a
// RateLimiter whose longest backoff you can wait for: controller-runtime's
// default doubles a failing object's delay up to 1,000 s.
func (r *Replica) NewController(name string, rec reconcile.TypedReconciler[Request], opts controller.TypedOptions[Request]) (controller.TypedController[Request], error) {
	if err := r.controller.claim(name); err != nil {
		return nil, err
	}
	g := &guard{c: r.coord, inner: rec}
	if r.env.opts.AuditLog != nil {
		g.audit = &auditLog{w: r.env.opts.AuditLog}
	}
	opts.Reconciler = g
	opts.NeedLeaderElection = ptr.To(false)
	c, err := controller.NewTyped(name, r.env.mgr, opts)
	if err != nil {
		return nil, fmt.Errorf("creating sharded controller %s: %w", name, err)
	}
	if err := c.Watch(source{r.coord}); err != nil {
		return nil, fmt.Errorf("watching shards: %w", err)
	}
	return c, nil
}

// feeds is the one controller a shards' runtime feeds: its queue is the one
// the runtime's events and Enqueue go to.
type feeds struct {
	mu   sync.Mutex
	name string
}

// claim takes the runtime for the controller named name, once.
func (f *feeds) claim(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.name != "" {
		return fmt.Errorf("creating controller %s: the shards already feed controller %s (one controller per Replica or Single)", name, f.name)
	}
	f.name = name
	return nil
}

// Enqueue requests a reconcile of an object of a held shard, for events
// that do not come from the shard's informers (an external value changed).
// Requests for shards not held are dropped.
func (r *Replica) Enqueue(req Request) {
	if s := r.coord.shard(req.Shard); s != nil {
		s.enqueue(req.NamespacedName, false)
	}
}

// source hands the controller's queue to the Replica, whose shards feed it.
type source struct{ c *coordinator }

func (s source) Start(_ context.Context, q workqueue.TypedRateLimitingInterface[Request]) error {
	s.c.queue.set(q)
	return nil
}

func (s source) String() string { return "sharding.Replica(" + s.c.opts.Ring + ")" }

// guard admits a reconcile only while its shard is held, counts it as in
// flight for the drain, and cancels it when the shard stops.
type guard struct {
	c     *coordinator
	inner reconcile.TypedReconciler[Request]
	audit *auditLog
}

func (g *guard) Reconcile(ctx context.Context, req Request) (reconcile.Result, error) {
	s := g.c.shard(req.Shard)
	if s == nil || !s.begin() {
		return reconcile.Result{}, nil
	}
	defer s.end()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	refused := new(atomic.Bool)
	ctx = context.WithValue(ctx, refusalKey{}, refused)
	res, err := g.reconcile(ctx, s, req)
	if err == nil && refused.Load() && s.active() {
		// WriteContext said no, yet the shard is still held: its hold
		// lapsed for a moment (a renewal whose success was recorded late,
		// a pause the renewal loop outlived) and a reconciler that
		// returned on the refusal would leave the object behind. Retry
		// it once the next renewal had its chance; a shard that was
		// fenced meanwhile drops the request, its next holder lists it.
		retry := g.c.opts.RetryPeriod / 4
		if res.RequeueAfter == 0 || res.RequeueAfter > retry {
			res.RequeueAfter = retry
		}
		g.c.metrics.refusedRetries.Inc()
	}
	return res, err
}

// refusalKey marks a reconcile's context so that WriteContext can tell the
// guard that it refused one of the reconcile's writes.
type refusalKey struct{}

// noteRefusal records on a guarded reconcile's context that a write was
// refused.
func noteRefusal(ctx context.Context) {
	if refused, ok := ctx.Value(refusalKey{}).(*atomic.Bool); ok {
		refused.Store(true)
	}
}

// reconcile runs the inner reconciler, between audit records when asked.
func (g *guard) reconcile(ctx context.Context, s *shard, req Request) (res reconcile.Result, err error) {
	if g.audit == nil {
		return g.inner.Reconcile(ctx, req)
	}
	a := &auditedReconcile{log: g.audit, rec: AuditRecord{Replica: g.c.opts.Identity, Shard: req.Shard, Namespace: req.Namespace, Name: req.Name}}
	if reader, ok := s.currentReader(); ok {
		if obj, ok := g.c.opts.For.Object.DeepCopyObject().(client.Object); ok && reader.Get(ctx, req.NamespacedName, obj) == nil {
			a.rec.Generation = obj.GetGeneration()
		}
	}
	a.record("start", "")
	// Deferred: a reconciler's panic, which controller-runtime recovers
	// from, still ends the record (as an error: the panic's).
	defer func() {
		if p := recover(); p != nil {
			a.record("end", "error")
			panic(p)
		}
		a.record("end", outcome(res, err))
	}()
	return g.inner.Reconcile(ctx, req)
}
