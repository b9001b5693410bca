// Package v1alpha1 holds the config.kshard.dev/v1alpha1 API: the ConfigBinding
// resource that kshard's reference controller reconciles.
//
// The validation markers here are the first line of defence: anything the API
// server can reject at admission never reaches a controller, so a bad object
// gets a clear error at write time instead of a condition later.
//
// +kubebuilder:object:generate=true
// +groupName=config.kshard.dev
package v1alpha1
