package configbinding

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
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
// compares data by digest: the caches keep no data (CacheTransform).
func ConfigMapPredicate() predicate.Predicate {
	return predicate.Funcs{
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
