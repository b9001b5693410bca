package configbinding

import (
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
)

// renderConfigMap is the ConfigMap a ConfigBinding wants: its values, the
// binding's shard labels (owned: so the shard's informer sees it and drift
// is noticed), and a controller owner reference (so deleting the binding
// deletes it, and only the garbage collector ever does).
func renderConfigMap(cb *configv1alpha1.ConfigBinding, owned, data map[string]string) *corev1ac.ConfigMapApplyConfiguration {
	return corev1ac.ConfigMap(cb.Spec.Target.ConfigMapName, cb.Namespace).
		WithLabels(owned).
		WithLabels(map[string]string{LabelManagedBy: FieldManager}).
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(configv1alpha1.GroupVersion.String()).
			WithKind("ConfigBinding").
			WithName(cb.Name).
			WithUID(cb.UID).
			WithController(true).
			WithBlockOwnerDeletion(true)).
		WithData(data)
}
