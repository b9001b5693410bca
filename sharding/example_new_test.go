package sharding_test

import (
	"context"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/sharding"
)

// A controller's main: the Replica claims shards, elects the labeler and
// feeds one controller; the reconciler reads the shard's
// objects through Reader and asks WriteContext before each write. Run it
// as a StatefulSet, with the Replica's Ready as its readiness check.
func ExampleNew() {
	// No manager leader election: the Replica takes its labeler Lease itself,
	// and every replica runs its own shards.
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), manager.Options{})
	if err != nil {
		panic(err)
	}
	rep, err := sharding.New(mgr, sharding.Options{
		Ring:           "bindings",
		LeaseNamespace: "bindings-system",
		StatefulSet:    "bindings",
		For:            sharding.Kind{Object: &configv1alpha1.ConfigBinding{}},
		Owns:           []sharding.Kind{{Object: &corev1.ConfigMap{}}},
		Domain:         func(o client.Object) string { return o.(*configv1alpha1.ConfigBinding).Spec.Domain },
	})
	if err != nil {
		panic(err)
	}
	reconciler := reconcile.TypedFunc[sharding.Request](func(ctx context.Context, req sharding.Request) (reconcile.Result, error) {
		reader, ok := rep.Reader(req.Shard)
		if !ok {
			return reconcile.Result{}, nil // the shard moved away
		}
		var cb configv1alpha1.ConfigBinding
		if err := reader.Get(ctx, req.NamespacedName, &cb); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		cm := &corev1.ConfigMap{}
		cm.Namespace, cm.Name = cb.Namespace, cb.Spec.Target.ConfigMapName
		cm.Labels = rep.OwnedLabels(req.Shard, cb.Spec.Domain) // so the shard's cache sees it
		wctx, done, ok := rep.WriteContext(ctx, req.Shard)
		if !ok {
			return reconcile.Result{}, nil // no longer held: the next holder writes
		}
		defer done()
		if err := mgr.GetClient().Create(wctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, nil
	})
	if _, err := rep.NewController("bindings", reconciler, controller.TypedOptions[sharding.Request]{MaxConcurrentReconciles: 8}); err != nil {
		panic(err)
	}
	if err := mgr.AddReadyzCheck("shards", func(*http.Request) error { return rep.Ready() }); err != nil {
		panic(err)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		panic(err)
	}
}
