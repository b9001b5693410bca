package sharding

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	ctrlsource "sigs.k8s.io/controller-runtime/pkg/source"
)

// labeler stamps the domain and shard labels on primary objects that have
// no valid shard label. It runs on the elected leader only and watches only
// those objects (selector: shard label not in [0, shards)), so it costs
// nothing while every object is labeled, and no webhook sits on the write
// path: a new object waits for one watch event and one patch instead.
type labeler struct {
	r         *Replica
	unlabeled atomic.Int64
	refused   atomic.Bool // logged that the shard counts disagree
}

// NeedLeaderElection is false: the labeler runs its own election, on Lease
// <ring>-labeler. A manager's lost election ends the whole process, so a
// replica paused past its lease while it labels would take its shards down
// with it; losing this election stops the labeling only, and the replica
// campaigns again.
func (l *labeler) NeedLeaderElection() bool { return false }

// unlabeledSelector matches objects whose shard label is missing or is not
// one of the ring's shards.
func unlabeledSelector(shards int32) (labels.Selector, error) {
	values := make([]string, shards)
	for i := range values {
		values[i] = strconv.Itoa(i)
	}
	req, err := labels.NewRequirement(LabelShard, selection.NotIn, values)
	if err != nil {
		return nil, fmt.Errorf("building the unlabeled-object selector: %w", err)
	}
	return labels.NewSelector().Add(*req), nil
}

// Start campaigns for the labeler Lease until ctx is done, labeling while
// it holds it.
func (l *labeler) Start(ctx context.Context) error {
	r := l.r
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: r.opts.LeaseNamespace, Name: LabelerLeaseName(r.opts.Ring)},
		Client:     r.leases.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: r.holder},
	}
	for ctx.Err() == nil {
		done := make(chan struct{})
		var led atomic.Bool
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   r.opts.LeaseDuration,
			RenewDeadline:   r.opts.RenewDeadline,
			RetryPeriod:     r.opts.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            LabelerLeaseName(r.opts.Ring),
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					led.Store(true)
					defer close(done)
					if err := l.lead(lctx); err != nil && lctx.Err() == nil {
						r.log.Error(err, "Labeling")
					}
				},
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return fmt.Errorf("creating the labeler's election: %w", err)
		}
		le.Run(ctx)
		if led.Load() {
			<-done
			r.log.Info("Stopped labeling: the labeler Lease was lost or released")
		}
	}
	return nil
}

// lead labels unlabeled objects until ctx (the labeler's term) ends.
func (l *labeler) lead(ctx context.Context) error {
	r := l.r
	r.metrics.labeler.Set(1)
	defer r.metrics.labeler.Set(0)
	l.unlabeled.Store(0) // this term's cache counts them afresh
	sel, err := unlabeledSelector(r.opts.Shards)
	if err != nil {
		return err
	}
	mgr := r.mgr
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient:           mgr.GetHTTPClient(),
		Scheme:               mgr.GetScheme(),
		Mapper:               mgr.GetRESTMapper(),
		DefaultLabelSelector: sel,
		DefaultNamespaces:    r.namespaces(),
		DefaultTransform:     cache.TransformStripManagedFields(),
	})
	if err != nil {
		return fmt.Errorf("creating labeler cache: %w", err)
	}
	inf, err := c.GetInformer(ctx, r.opts.For.Object)
	if err != nil {
		return fmt.Errorf("watching unlabeled objects: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { l.r.metrics.unlabeled.Set(float64(l.unlabeled.Add(1))) },
		DeleteFunc: func(any) { l.r.metrics.unlabeled.Set(float64(l.unlabeled.Add(-1))) },
	}); err != nil {
		return fmt.Errorf("counting unlabeled objects: %w", err)
	}
	ctl, err := controller.NewUnmanaged("kshard-labeler-"+r.opts.Ring, controller.Options{
		Reconciler: reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			return l.reconcile(ctx, c, req)
		}),
		MaxConcurrentReconciles: r.opts.LabelerWorkers,
		SkipNameValidation:      ptr.To(true),
		Logger:                  r.log.WithName("labeler"),
	})
	if err != nil {
		return fmt.Errorf("creating labeler: %w", err)
	}
	if err := ctl.Watch(ctrlsource.Kind(c, r.opts.For.Object, &handler.EnqueueRequestForObject{})); err != nil {
		return fmt.Errorf("creating labeler: %w", err)
	}
	r.log.Info("Labeling unlabeled objects as the elected labeler")
	errs := make(chan error, 2)
	go func() { errs <- c.Start(ctx) }()
	go func() { errs <- ctl.Start(ctx) }()
	err = <-errs
	<-errs
	l.r.metrics.unlabeled.Set(0)
	return err
}

func (l *labeler) reconcile(ctx context.Context, c client.Reader, req reconcile.Request) (reconcile.Result, error) {
	obj, ok := l.r.opts.For.Object.DeepCopyObject().(client.Object)
	if !ok {
		return reconcile.Result{}, fmt.Errorf("%T is not a client.Object", l.r.opts.For.Object)
	}
	if err := c.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if err := l.r.agreesWithRing(); err != nil {
		// Labeling by another shard count would put objects in shards
		// nobody runs, or fight the replicas that correct labels.
		if l.refused.CompareAndSwap(false, true) {
			l.r.log.Error(err, "NOT LABELING objects as the elected leader until the shard counts agree")
		}
		return reconcile.Result{RequeueAfter: l.r.opts.RetryPeriod}, nil
	}
	l.refused.Store(false)
	domain := l.r.opts.Domain(obj)
	return reconcile.Result{}, l.r.stampLabels(ctx, obj, domain, ShardOf(domain, l.r.opts.Shards))
}
