package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ExternalDomainSpec names the business domain an ExternalDomain mirrors.
// The object's name is the domain, so there is one mirror per domain.
type ExternalDomainSpec struct {
	// Domain is the config-center domain mirrored into status.
	//
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="domain must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="domain is immutable"
	Domain string `json:"domain"`
}

// MirroredKey is one key of the domain as the config center last answered it.
type MirroredKey struct {
	// Name is the key's name in its domain.
	Name string `json:"name"`
	// Value is the key's content.
	Value string `json:"value"`
	// Revision is the config-center revision of the key's last change.
	Revision int64 `json:"revision"`
}

// ExternalDomainStatus mirrors the domain's keys. Only the replica holding
// the domain's shard writes it.
type ExternalDomainStatus struct {
	// Keys are the domain's keys and values, sorted by name. Empty while the
	// domain is too large to mirror (see the Synced condition).
	// +optional
	// +listType=map
	// +listMapKey=name
	Keys []MirroredKey `json:"keys,omitempty"`

	// KeyCount is how many keys the domain holds in the config center, also
	// when they are too large to mirror.
	// +optional
	KeyCount int32 `json:"keyCount,omitempty"`

	// Bytes is the size of the keys' names and values.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`

	// Revision is the config-center revision the mirror is current to.
	// +optional
	Revision int64 `json:"revision,omitempty"`

	// Epoch names the config center's history that Revision belongs to
	// (the change feed's epoch; it changes when the config center restarts
	// and its revisions start over). The next holder of the shard resumes
	// from Revision only in the same epoch; in another it mirrors the domain
	// again from the start. Empty when the config center names none.
	// +optional
	Epoch string `json:"epoch,omitempty"`

	// LastSyncTime is when the mirror last caught up with the change feed.
	// +optional
	LastSyncTime *metav1.Time `json:"lastSyncTime,omitempty"`

	// Shard is the shard of the domain; its holder writes the mirror.
	// +optional
	Shard *int32 `json:"shard,omitempty"`

	// Replica is the replica that last wrote the mirror.
	// +optional
	Replica string `json:"replica,omitempty"`

	// Conditions say whether the mirror is current (Synced) and, when it
	// is not, why.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ExternalDomain mirrors one business domain of the config center into the
// API server, for the mirror strategy (--external-source=mirror): replicas
// keep it current from the change feed, and ConfigBinding reconciles read
// values from its informer cache instead of the network. It is cluster
// scoped because a domain spans namespaces, and sharded like the
// ConfigBindings of its domain (it carries their shard label).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=xd,categories=kshard
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.spec.domain",message="metadata.name must equal spec.domain: there is one ExternalDomain per domain"
// +kubebuilder:printcolumn:name="Domain",type=string,JSONPath=`.spec.domain`
// +kubebuilder:printcolumn:name="Keys",type=integer,JSONPath=`.status.keyCount`
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.revision`
// +kubebuilder:printcolumn:name="Last Sync",type=date,JSONPath=`.status.lastSyncTime`
// +kubebuilder:printcolumn:name="Shard",type=integer,JSONPath=`.status.shard`
// +kubebuilder:printcolumn:name="Synced",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].reason`,priority=1
// +kubebuilder:printcolumn:name="Replica",type=string,JSONPath=`.status.replica`,priority=1
type ExternalDomain struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ExternalDomainSpec `json:"spec"`
	// +optional
	Status ExternalDomainStatus `json:"status,omitempty"`
}

// ExternalDomainList is a list of ExternalDomains.
//
// +kubebuilder:object:root=true
type ExternalDomainList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ExternalDomain `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ExternalDomain{}, &ExternalDomainList{})
}
