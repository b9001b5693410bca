package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConfigKey names one key of a domain in the config center. It is used as a
// URL path segment and as a ConfigMap data key, so it is restricted to
// characters that are safe in both and cannot climb out of the domain.
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$')",message="a key must be lowercase letters, digits, '.', '_' or '-', starting and ending with a letter or digit (no '/')"
// +kubebuilder:validation:XValidation:rule="!self.contains('..')",message="a key must not contain '..'"
type ConfigKey string

// ConfigBindingSpec says which keys of which business domain to copy into
// which ConfigMap.
type ConfigBindingSpec struct {
	// Domain is the business domain in the config center that the keys belong
	// to. It decides the object's shard, so it cannot change after creation:
	// a different domain is a different ConfigBinding.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="domain must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="domain is immutable: create a new ConfigBinding for another domain"
	Domain string `json:"domain"`

	// Keys are the config-center keys to bind, each once.
	//
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	Keys []ConfigKey `json:"keys"`

	// Target is where the values are written.
	//
	// +required
	Target ConfigBindingTarget `json:"target"`
}

// ConfigBindingTarget names the ConfigMap, in the ConfigBinding's namespace,
// that the controller owns and keeps equal to the bound keys.
type ConfigBindingTarget struct {
	// ConfigMapName is the name of the ConfigMap to write.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="configMapName must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
	ConfigMapName string `json:"configMapName"`
}

// ConfigBindingStatus is what the controller last did with the object, and
// in which shard. It names no replica: the shard's holder is in its Lease
// (`kshard status`), so a handover moves ownership without rewriting a
// single object.
type ConfigBindingStatus struct {
	// ObservedGeneration is the spec generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Shard is the shard that reconciled the object.
	// +optional
	Shard *int32 `json:"shard,omitempty"`

	// ResolvedRevision is the highest config-center revision among the
	// bound keys' values that the ConfigMap holds.
	// +optional
	ResolvedRevision int64 `json:"resolvedRevision,omitempty"`

	// Conditions say whether the ConfigMap holds the current values (Ready)
	// and, when it does not, why. The Ready reasons: Synced; KeyNotFound,
	// ExternalUnavailable, ExternalRefused, ValueTooLarge, DomainTooLarge
	// and ValuesDoNotFit (the values);
	// TargetConflict (the ConfigMap is someone else's); TargetForbidden,
	// TargetTooLarge, TargetImmutable, TargetKeyConflict and TargetInvalid
	// (the API server refuses the ConfigMap, or would: its message is
	// quoted). In every case but Synced the ConfigMap keeps its last values.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConfigBinding binds keys of one business domain in the external config
// center into a ConfigMap. It is kshard's reference workload: sharded by
// domain, reconciled from an off-heap cache of the config center.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cb,categories=kshard
// +kubebuilder:printcolumn:name="Domain",type=string,JSONPath=`.spec.domain`
// +kubebuilder:printcolumn:name="Shard",type=integer,JSONPath=`.status.shard`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.resolvedRevision`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ConfigBinding struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ConfigBindingSpec `json:"spec"`
	// +optional
	Status ConfigBindingStatus `json:"status,omitempty"`
}

// ConfigBindingList is a list of ConfigBindings.
//
// +kubebuilder:object:root=true
type ConfigBindingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ConfigBinding `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ConfigBinding{}, &ConfigBindingList{})
}
