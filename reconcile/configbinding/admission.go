package configbinding

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/authzcache"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/reconcile/externaldomain"
	"github.com/kshard/kshard/sharding"
)

// WebhookPath is where the admission pre-check is served.
const WebhookPath = "/validate-config-kshard-dev-v1alpha1-configbinding"

// KeyKnowledge is what a replica knows locally about whether keys exist.
type KeyKnowledge interface {
	// Exists reports whether the key exists; known is false when the
	// replica cannot tell without calling the config center.
	Exists(ctx context.Context, key externalcache.Key) (exists, known bool)
}

// Admission pre-checks ConfigBindings: a key the replica knows does not
// exist is rejected with a message naming it; a key it cannot tell about is
// allowed with a warning. It never calls the config center, so its latency
// is bounded by local reads; it is served with failurePolicy Ignore, so a
// replica that is down never blocks writes.
type Admission struct {
	Keys KeyKnowledge
	// Authorization, when set, refuses a binding whose namespace may not
	// read its domain, naming the grant that is missing. A decision the
	// replica's cache does not have yet is waited for, up to
	// AuthorizationWait (default 2s); with none by then (a cold cache, an
	// unreachable authorization system) the binding is refused, unless
	// AuthorizationFailOpen.
	Authorization         AuthorizationKnowledge
	AuthorizationWait     time.Duration
	AuthorizationFailOpen bool
}

// AuthorizationKnowledge is the replica's cache of authorization decisions
// (*authzcache.Cache): Await waits for a first answer until ctx ends.
type AuthorizationKnowledge interface {
	Await(ctx context.Context, q authzcache.Question) (authzcache.Decision, authzcache.State)
}

var _ admission.Validator[*configv1alpha1.ConfigBinding] = (*Admission)(nil)

// ValidateCreate checks every key.
func (a *Admission) ValidateCreate(ctx context.Context, cb *configv1alpha1.ConfigBinding) (admission.Warnings, error) {
	return a.check(ctx, cb, nil)
}

// ValidateUpdate checks only keys the update adds: a key deleted from the
// config center later must not block unrelated edits of the binding.
func (a *Admission) ValidateUpdate(ctx context.Context, oldCB, cb *configv1alpha1.ConfigBinding) (admission.Warnings, error) {
	return a.check(ctx, cb, oldCB.Spec.Keys)
}

// ValidateDelete allows every deletion.
func (a *Admission) ValidateDelete(context.Context, *configv1alpha1.ConfigBinding) (admission.Warnings, error) {
	return nil, nil
}

func (a *Admission) check(ctx context.Context, cb *configv1alpha1.ConfigBinding, had []configv1alpha1.ConfigKey) (admission.Warnings, error) {
	if err := a.authorize(ctx, cb); err != nil {
		return nil, err
	}
	var errs field.ErrorList
	var unknown []string
	for i, k := range cb.Spec.Keys {
		if slices.Contains(had, k) {
			continue
		}
		exists, known := a.Keys.Exists(ctx, externalcache.Key{Domain: cb.Spec.Domain, Name: string(k)})
		switch {
		case !known:
			unknown = append(unknown, string(k))
		case !exists:
			errs = append(errs, field.Invalid(field.NewPath("spec", "keys").Index(i), string(k),
				fmt.Sprintf("no such key in domain %q of the config center", cb.Spec.Domain)))
		}
	}
	var warnings admission.Warnings
	if len(unknown) > 0 {
		warnings = append(warnings, fmt.Sprintf("not checked (domain %q is not known to this replica yet): %s; the status will say KeyNotFound if they do not exist",
			cb.Spec.Domain, strings.Join(unknown, ", ")))
	}
	if len(errs) > 0 {
		return warnings, apierrors.NewInvalid(configv1alpha1.GroupVersion.WithKind("ConfigBinding").GroupKind(), cb.Name, errs)
	}
	return warnings, nil
}

// authorize refuses a binding its namespace may not read, and, unless
// AuthorizationFailOpen, one the authorization system has not decided.
func (a *Admission) authorize(ctx context.Context, cb *configv1alpha1.ConfigBinding) error {
	if a.Authorization == nil {
		return nil
	}
	wait := a.AuthorizationWait
	if wait <= 0 {
		wait = 2 * time.Second
	}
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	d, st := a.Authorization.Await(actx, authzcache.Question{Namespace: cb.Namespace, Domain: cb.Spec.Domain})
	gk := configv1alpha1.GroupVersion.WithKind("ConfigBinding").GroupKind()
	switch {
	case st == authzcache.Unknown && !a.AuthorizationFailOpen:
		return apierrors.NewInvalid(gk, cb.Name, field.ErrorList{field.Forbidden(field.NewPath("spec", "domain"),
			fmt.Sprintf("the authorization system has not decided within %s whether namespace %s may read domain %q (it is unreachable or slow); try again", wait, cb.Namespace, cb.Spec.Domain))})
	case st != authzcache.Unknown && !d.Allowed:
		return apierrors.NewInvalid(gk, cb.Name, field.ErrorList{field.Forbidden(field.NewPath("spec", "domain"),
			fmt.Sprintf("namespace %s may not read domain %q: the authorization system has no %s", cb.Namespace, cb.Spec.Domain, d.Missing))})
	}
	return nil
}

// CacheKnowledge answers from the external cache's change feeds: a domain
// used by a shard this replica holds is listed by its feed, so any key of it
// is known to exist or not; other domains are unknown.
type CacheKnowledge struct {
	Cache FeedKeys
}

// FeedKeys answers from change feeds alone whether a key exists, never
// calling the service; *shardcache.Cache and *externalcache.Cache
// implement it.
type FeedKeys interface {
	KeyExists(key externalcache.Key) (exists, known bool)
}

// Exists implements KeyKnowledge.
func (k CacheKnowledge) Exists(_ context.Context, key externalcache.Key) (bool, bool) {
	return k.Cache.KeyExists(key)
}

// MirrorKnowledge answers from the domain's ExternalDomain mirror: from the
// shard's cache when this replica holds the domain, else by one read of the
// mirror from the API server (never from the config center), bounded by
// Timeout. A domain whose mirror is not synced is unknown.
type MirrorKnowledge struct {
	Shards    Shards
	APIReader client.Reader
	// Timeout bounds the API-server read. Defaults to one second.
	Timeout time.Duration
}

// Exists implements KeyKnowledge.
func (k MirrorKnowledge) Exists(ctx context.Context, key externalcache.Key) (bool, bool) {
	var ed configv1alpha1.ExternalDomain
	name := types.NamespacedName{Name: key.Domain}
	if reader, ok := k.Shards.Reader(sharding.ShardOf(key.Domain, k.Shards.Count())); ok {
		if err := reader.Get(ctx, name, &ed); err != nil {
			return false, false
		}
	} else {
		timeout := k.Timeout
		if timeout == 0 {
			timeout = time.Second
		}
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := k.APIReader.Get(ctx, name, &ed); err != nil {
			return false, false
		}
	}
	c := meta.FindStatusCondition(ed.Status.Conditions, externaldomain.ConditionSynced)
	if c == nil || c.Status != metav1.ConditionTrue {
		return false, false
	}
	_, found := slices.BinarySearchFunc(ed.Status.Keys, key.Name, func(m configv1alpha1.MirroredKey, n string) int {
		return strings.Compare(m.Name, n)
	})
	return found, true
}
