package sharding

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"k8s.io/client-go/tools/leaderelection"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	ctrlsource "sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kshard/kshard/internal/backoff"
	"github.com/kshard/kshard/sharding/lease"
)

// labeler stamps the domain and shard labels on primary objects that have
// no valid shard label. It runs on one replica at a time, the holder of the
// ring's labeler Lease (held as a shard's is: lease.go), and watches only
// those objects (selector: shard label not in [0, shards)), so it costs
// nothing while every object is labeled, and no webhook sits on the write
// path: a new object waits for one watch event and one patch instead. With
// a shard table (Options.ShardTable, shardtable.go) it records each domain
// it labels, so that the API server labels the domain's later objects at
// admission and they wait for nothing.
//
// Only a replica in the ring may label: one whose shard count differed (a
// rolling update changing --shards) or whose identity another process runs
// used to win the labeler Lease, keep it and label nothing, so no object
// created meanwhile was ever reconciled. Its lifecycle is one state machine
// (labelerState), run by Start.
type labeler struct {
	env *env
	// inRing says why this replica may not label now (nil: it may).
	inRing    func() error
	kick      chan struct{} // the ring or this replica's place in it may have changed
	unlabeled atomic.Int64
	log       logr.Logger

	mu    sync.Mutex
	state labelerState
}

// labelerState is where this replica is with the ring's labeling.
type labelerState int

const (
	// labelerIdle: this replica is not in the ring (Replica.inRing says
	// why: another process runs its identity, its shard count differs from
	// the ring's, it has not joined yet), so it does not campaign.
	labelerIdle labelerState = iota
	// labelerCampaigning: in the ring, it campaigns for the labeler Lease.
	labelerCampaigning
	// labelerLeading: it holds the labeler Lease and labels.
	labelerLeading
	// labelerSteppingDown: its term ends (it left the ring, the Lease was
	// lost, the labeling failed, the replica stops): the labeling stops,
	// then the Lease is released, so two replicas never label at once.
	labelerSteppingDown
)

func (st labelerState) String() string {
	return [...]string{"Idle", "Campaigning", "Leading", "SteppingDown"}[st]
}

func newLabeler(e *env, inRing func() error) *labeler {
	return &labeler{env: e, inRing: inRing, kick: make(chan struct{}, 1), log: e.log.WithName("labeler")}
}

// wake makes the labeler look at the ring again. It never blocks.
func (l *labeler) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// setState moves to a state and logs the change with why.
func (l *labeler) setState(st labelerState, why error) {
	l.mu.Lock()
	from := l.state
	l.state = st
	l.mu.Unlock()
	if from == st {
		return
	}
	if why != nil {
		l.log.Info("Labeler", "state", st, "from", from, "reason", why.Error())
		return
	}
	l.log.Info("Labeler", "state", st, "from", from)
}

// NeedLeaderElection is false: the labeler holds its own Lease,
// <ring>-labeler, as a shard's is held. A manager's lost election ends the whole process, so a
// replica paused past its lease while it labels would take its shards down
// with it; losing this election stops the labeling only, and the replica
// campaigns again.
func (l *labeler) NeedLeaderElection() bool { return false }

// shardNumbers lists a ring's shards, 0 to shards-1: the labeler watches
// the objects whose shard label is missing or names none of them.
func shardNumbers(shards int32) []int32 {
	out := make([]int32, shards)
	for i := range out {
		out[i] = int32(i)
	}
	return out
}

// Start runs the labeler's lifecycle until ctx is done: Idle while this
// replica is not in the ring, Campaigning and Leading while it is, and
// SteppingDown at the end of each campaign.
func (l *labeler) Start(ctx context.Context) error {
	for ctx.Err() == nil {
		if why := l.inRing(); why != nil {
			l.setState(labelerIdle, why)
			select {
			case <-ctx.Done():
			case <-l.kick:
			}
			continue
		}
		failed, err := l.campaign(ctx)
		if err != nil {
			return err
		}
		if failed {
			// Labeling failed while leading: let another replica try
			// before this one campaigns again.
			select {
			case <-ctx.Done():
			case <-time.After(l.env.opts.RetryPeriod):
			}
		}
	}
	l.setState(labelerIdle, context.Cause(ctx))
	return nil
}

// campaign takes the labeler Lease once it is free or expired, and labels
// while it holds it, renewing it as a shard's is renewed, until ctx is done,
// this replica leaves the ring, a renewal fails until the renew deadline
// (the term is lost: the labeling stops before the Lease can expire for
// anyone else), or the labeling ends by itself (failed reports that). Then
// it steps down: the labeling stops first, then the Lease is released, so
// the next labeler can start at once.
func (l *labeler) campaign(ctx context.Context) (failed bool, err error) {
	e := l.env
	lease := e.newLeaseWriter(lease.LabelerName(e.opts.Ring), nil, nil)
	l.setState(labelerCampaigning, nil)
	var renewed time.Time
	for {
		tctx, cancel := context.WithTimeout(ctx, e.opts.RenewDeadline)
		start := time.Now()
		_, err := lease.take(tctx)
		cancel()
		if err == nil {
			renewed = start
			break
		}
		if !errors.Is(err, errLeaseHeld) && !apierrors.IsConflict(err) && ctx.Err() == nil {
			l.log.Error(err, "Taking the labeler Lease")
		}
		select {
		case <-ctx.Done():
			return false, nil
		case <-l.kick:
			if l.inRing() != nil {
				return false, nil
			}
		case <-time.After(backoff.Jitter(e.opts.RetryPeriod, leaderelection.JitterFactor)):
		}
	}

	l.setState(labelerLeading, nil)
	termCtx, endTerm := context.WithCancel(ctx)
	defer endTerm()
	ended := make(chan error, 1)
	go func() { ended <- l.lead(termCtx) }()
	renewal := time.NewTicker(e.opts.RetryPeriod)
	defer renewal.Stop()
	var why error
	lost := false
leading:
	for {
		select {
		case <-ctx.Done():
			why = context.Cause(ctx)
			break leading
		case <-l.kick:
			if why = l.inRing(); why != nil {
				break leading
			}
		case err := <-ended:
			ended = nil
			if ctx.Err() != nil {
				why = context.Cause(ctx)
				break leading
			}
			if err == nil {
				err = errors.New("the labeling stopped by itself")
			}
			l.log.Error(err, "Labeling failed; stepping down")
			failed, why = true, err
			break leading
		case <-renewal.C:
			at, err := lease.renewBefore(ctx, renewed.Add(e.opts.RenewDeadline), e.opts.RetryPeriod/4)
			if err != nil {
				lost, why = true, fmt.Errorf("the labeler Lease was lost: %w", err)
				break leading
			}
			renewed = at
		}
	}
	l.setState(labelerSteppingDown, why)
	endTerm()
	if ended != nil {
		<-ended
	}
	if !lost {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.RenewDeadline)
		if err := lease.release(rctx); err != nil {
			l.log.Error(err, "Releasing the labeler Lease; it expires by itself")
		}
		cancel()
	}
	l.log.Info("Stopped labeling", "reason", why.Error())
	return failed, nil
}

// lead labels unlabeled objects until ctx (the labeler's term) ends.
func (l *labeler) lead(ctx context.Context) error {
	e := l.env
	e.metrics.labeler.Set(1)
	defer e.metrics.labeler.Set(0)
	l.unlabeled.Store(0) // this term's cache counts them afresh
	sel, err := e.keys.shardSelector(selection.NotIn, shardNumbers(e.opts.Shards)...)
	if err != nil {
		return err
	}
	// Only the objects the replicas would cache: one For's Selector leaves
	// out is never any shard's, so labeling it would only widen what the
	// ServiceAccount must be allowed to patch (every ConfigMap of the
	// cluster, for a controller of some of them). For's Predicates are not
	// applied: they filter events, and one that drops an object's create
	// may pass its next update; say which objects are the controller's with
	// the Selector.
	if s := e.opts.For.Selector; s != nil {
		reqs, _ := s.Requirements()
		sel = sel.Add(reqs...)
	}
	mgr := e.mgr
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient:           mgr.GetHTTPClient(),
		Scheme:               mgr.GetScheme(),
		Mapper:               mgr.GetRESTMapper(),
		DefaultLabelSelector: sel,
		DefaultNamespaces:    e.namespaces(),
		DefaultTransform:     cache.TransformStripManagedFields(),
	})
	if err != nil {
		return fmt.Errorf("creating labeler cache: %w", err)
	}
	inf, err := c.GetInformer(ctx, e.opts.For.Object)
	if err != nil {
		return fmt.Errorf("watching unlabeled objects: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.env.metrics.unlabeled.Set(float64(l.unlabeled.Add(1))) },
		DeleteFunc: func(any) { l.env.metrics.unlabeled.Set(float64(l.unlabeled.Add(-1))) },
	}); err != nil {
		return fmt.Errorf("counting unlabeled objects: %w", err)
	}
	var table *shardTable
	if e.opts.ShardTable != "" {
		table = newShardTable(e)
	}
	ctl, err := controller.NewUnmanaged("kshard-labeler-"+e.opts.Ring, controller.Options{
		Reconciler: reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			return l.reconcile(ctx, c, table, req)
		}),
		MaxConcurrentReconciles: e.opts.LabelerWorkers,
		SkipNameValidation:      ptr.To(true),
		Logger:                  l.log,
	})
	if err != nil {
		return fmt.Errorf("creating labeler: %w", err)
	}
	if err := ctl.Watch(ctrlsource.Kind(c, e.opts.For.Object, &handler.EnqueueRequestForObject{})); err != nil {
		return fmt.Errorf("creating labeler: %w", err)
	}
	l.log.Info("Labeling unlabeled objects as the elected labeler")
	errs := make(chan error, 2)
	e.metrics.caches.WithLabelValues("labeler").Inc()
	var tableDone sync.WaitGroup
	if table != nil {
		tableDone.Go(func() { table.run(ctx) })
	}
	go func() { errs <- c.Start(ctx) }()
	go func() { errs <- ctl.Start(ctx) }()
	err = <-errs
	<-errs
	tableDone.Wait()
	l.env.metrics.unlabeled.Set(0)
	return err
}

// reconcile labels one object, and adds its domain to the shard table (when
// the ring keeps one), so that the next object of the domain is labeled at
// admission.
func (l *labeler) reconcile(ctx context.Context, c client.Reader, table *shardTable, req reconcile.Request) (reconcile.Result, error) {
	obj, ok := l.env.opts.For.Object.DeepCopyObject().(client.Object)
	if !ok {
		return reconcile.Result{}, fmt.Errorf("%T is not a client.Object", l.env.opts.For.Object)
	}
	if err := c.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if l.inRing() != nil {
		// Labeling by another shard count would put objects in shards
		// nobody runs, or fight the replicas that correct labels. This
		// replica is stepping down (campaign): the next labeler lists
		// this object afresh.
		return reconcile.Result{}, nil
	}
	domain := l.env.opts.Domain(obj)
	shard := ShardOf(domain, l.env.opts.Shards)
	if err := l.env.stampLabels(ctx, obj, domain, shard); err != nil {
		if leaseMissing(err) {
			// The shard's Lease does not exist yet (a ring starting): the
			// API server fails a write into the shard closed until its
			// holder creates it.
			l.log.V(1).Info("Shard Lease not created yet; labeling later", "object", req.NamespacedName, "shard", shard)
			return reconcile.Result{RequeueAfter: l.env.opts.RetryPeriod}, nil
		}
		return reconcile.Result{}, err
	}
	if table != nil {
		table.add(domain, shard)
	}
	return reconcile.Result{}, nil
}

// stampLabels writes an object's domain and shard labels with a merge
// patch. Only the labeler stamps them (deploy/base's kshard-labeler-writes
// policy): a shard's holder removes a wrong label (shard.unlabel), and the
// labeler stamps the right one.
func (e *env) stampLabels(ctx context.Context, o client.Object, domain string, shard int32) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": e.keys.owned(shard, domain)}})
	if err != nil {
		return err
	}
	obj, ok := o.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("%T is not a client.Object", o)
	}
	if err := e.writer.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("labeling %s with shard %d: %w", client.ObjectKeyFromObject(o), shard, err)
	}
	return nil
}

// leaseMissing reports whether the API server refused a write because an
// admission policy binding's param is missing and the binding fails closed
// (parameterNotFoundAction Deny): deploy/base's fence, for a shard whose
// Lease does not exist yet.
func leaseMissing(err error) bool {
	return apierrors.IsInvalid(err) && strings.Contains(err.Error(), "parameterNotFoundAction")
}
