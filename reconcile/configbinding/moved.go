package configbinding

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/sharding"
)

// handOverTargets hands this shard's ConfigMaps of a binding that is not in
// this shard to the binding's own shard: when the binding moved (a label
// corrected, a new shard count), or someone created its target with this
// shard's label. A replica writes an object only in shards it holds, before
// and after the write (deploy/base's kshard-shard-writes policy), so the
// holder of the binding's shard cannot take a ConfigMap labelled with this
// one: this shard's holder removes the ConfigMap's shard labels, changing
// nothing else, and the binding's holder then applies it with its own.
//
// Reconcile calls it when the binding is not in this shard's cache. The
// binding is read from the API server first: absent (the garbage collector
// deletes its ConfigMaps), or labelled with this shard (this cache is only
// behind), nothing is handed over.
func (r *Reconciler) handOverTargets(ctx context.Context, reader client.Reader, shard int32, key types.NamespacedName) error {
	if r.APIReader == nil {
		return nil
	}
	var cms corev1.ConfigMapList
	if err := reader.List(ctx, &cms, client.InNamespace(key.Namespace)); err != nil {
		return fmt.Errorf("listing the ConfigMaps of shard %d in %s: %w", shard, key.Namespace, err)
	}
	var targets []corev1.ConfigMap
	for _, cm := range cms.Items {
		if ref := metav1.GetControllerOf(&cm); ref != nil && ref.Kind == "ConfigBinding" && ref.Name == key.Name {
			targets = append(targets, cm)
		}
	}
	if len(targets) == 0 {
		return nil
	}
	// A list by name: the replicas may list ConfigBindings, not get them.
	var list configv1alpha1.ConfigBindingList
	if err := r.APIReader.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingFields{"metadata.name": key.Name}); err != nil {
		return fmt.Errorf("reading ConfigBinding %s: %w", key, err)
	}
	if len(list.Items) == 0 {
		return nil
	}
	cb := list.Items[0]
	if cb.Labels[sharding.LabelShard] == strconv.Itoa(int(shard)) {
		return nil
	}
	for i := range targets {
		cm := &targets[i]
		if metav1.GetControllerOf(cm).UID != cb.UID {
			continue // an earlier binding's of the same name: collected with it
		}
		if err := r.unlabel(ctx, shard, cm); err != nil {
			return err
		}
		logf.FromContext(ctx).Info("Handed a ConfigMap to its binding's shard", "configMap", cm.Name,
			"from", shard, "to", cb.Labels[sharding.LabelShard])
	}
	return nil
}

// unlabel removes a ConfigMap's shard and domain labels while shard is held,
// conditionally on the resourceVersion it was read at.
func (r *Reconciler) unlabel(ctx context.Context, shard int32, cm *corev1.ConfigMap) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": cm.ResourceVersion,
		"labels":          map[string]any{sharding.LabelShard: nil, sharding.LabelDomain: nil},
	}})
	if err != nil {
		return err
	}
	wctx, done, ok := r.Shards.WriteContext(ctx, shard)
	if !ok {
		return nil
	}
	defer done()
	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: cm.Namespace, Name: cm.Name}}
	err = r.Client.Patch(wctx, obj, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager))
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("handing ConfigMap %s to its binding's shard: %w", cm.Name, err)
	}
	return nil
}
