package configbinding

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
)

// BindingPredicate passes ConfigBinding spec changes and periodic resyncs,
// and drops status-only updates (including our own status patches).
func BindingPredicate() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			if e.ObjectOld == nil || e.ObjectNew == nil {
				return true
			}
			resync := e.ObjectOld.GetResourceVersion() == e.ObjectNew.GetResourceVersion()
			return resync || e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration()
		},
	}
}

// ConfigMapPredicate passes deletions and drift of owned ConfigMaps (data,
// labels or owner references changed by someone), so they are restored. It
// compares data by digest: the caches keep no data (CacheTransform). A
// cache's initial list of ConfigMaps passes nothing: it comes with the
// initial list of their bindings, each of which is reconciled (at once, or
// when its keys arrive: ColdCachePredicate), and that reconcile compares its
// ConfigMap; one more request per binding would only repeat it.
func ConfigMapPredicate() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return !e.IsInInitialList },
		UpdateFunc: func(e event.UpdateEvent) bool {
			oldCM, ok1 := e.ObjectOld.(*corev1.ConfigMap)
			newCM, ok2 := e.ObjectNew.(*corev1.ConfigMap)
			if !ok1 || !ok2 {
				return true
			}
			return cachedDigest(oldCM) != cachedDigest(newCM) || !maps.Equal(oldCM.Labels, newCM.Labels) ||
				!slices.EqualFunc(oldCM.OwnerReferences, newCM.OwnerReferences, func(a, b metav1.OwnerReference) bool { return a.UID == b.UID })
		},
	}
}

// Fetcher looks a key up without waiting, and starts its fetch when it is
// not held; *shardcache.Cache and *externalcache.Cache implement it.
type Fetcher interface {
	Get(shard int32, key externalcache.Key) externalcache.Lookup
}

// ColdCachePredicate drops the create event of a binding from a cache's
// initial list (a replica's start, an acquired shard) when the binding is
// already Ready at its generation and a key of it is on its way to the
// external cache: the key's arrival requeues the binding (shardcache,
// on the cache's OnUpdate), and a reconcile now would find the key pending
// and write nothing. So a new owner's cold cache costs each binding one
// reconcile, not two. Looking the keys up starts their fetches. A key the
// cache cannot fetch now (its queue full, the config center held), a
// binding not Ready at its generation, and an object of no shard
// (shardOf's false) pass: nothing else would requeue them.
func ColdCachePredicate(values Fetcher, shardOf func(client.Object) (int32, bool)) predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool {
			cb, ok := e.Object.(*configv1alpha1.ConfigBinding)
			if !ok || !e.IsInInitialList || !readyAt(cb) {
				return true
			}
			shard, ok := shardOf(cb)
			if !ok {
				return true
			}
			pending := false
			for _, k := range cb.Spec.Keys {
				l := values.Get(shard, externalcache.Key{Domain: cb.Spec.Domain, Name: string(k)})
				if l.Err != nil {
					return true
				}
				pending = pending || l.State == externalcache.StatePending
			}
			return !pending
		},
	}
}
