package configbinding

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/authzcache"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/sharding"
)

// KeyIndex indexes ConfigBindings by the external keys they bind
// ("domain/key"), so a changed key finds its objects in the shard's cache
// instead of the external cache tracking who waits for what.
const KeyIndex = "kshard.dev/external-key"

// DomainIndex indexes ConfigBindings by domain, so a mirror whose condition
// changed, or a domain whose change feed became unhealthy or healed, finds
// the bindings of its domain without listing the shard.
const DomainIndex = "kshard.dev/domain"

// Indexes are the shard-cache indexes the reconciler's mappings need.
func Indexes() []sharding.Index {
	return []sharding.Index{{
		Object: &configv1alpha1.ConfigBinding{},
		Field:  KeyIndex,
		Extract: func(o client.Object) []string {
			cb, ok := o.(*configv1alpha1.ConfigBinding)
			if !ok {
				return nil
			}
			out := make([]string, 0, len(cb.Spec.Keys))
			for _, k := range cb.Spec.Keys {
				out = append(out, externalcache.Key{Domain: cb.Spec.Domain, Name: string(k)}.String())
			}
			return out
		},
	}, {
		Object: &configv1alpha1.ConfigBinding{},
		Field:  DomainIndex,
		Extract: func(o client.Object) []string {
			if cb, ok := o.(*configv1alpha1.ConfigBinding); ok {
				return []string{cb.Spec.Domain}
			}
			return nil
		},
	}}
}

// Enqueuer requests reconciles; *sharding.Replica implements it.
type Enqueuer interface {
	Enqueue(sharding.Request)
}

// KeyBindings lists the ConfigBindings of a shard's reader that bind a key:
// they are requeued when its value arrives, changes, or fails.
func KeyBindings(ctx context.Context, shard client.Reader, key externalcache.Key) ([]types.NamespacedName, error) {
	return bindings(ctx, shard, client.MatchingFields{KeyIndex: key.String()}, "key "+key.String())
}

// DomainBindings lists the ConfigBindings of a shard's reader that bind
// keys of a domain: they are requeued when the domain's change feed becomes
// unhealthy or heals, so that they say so and read their keys again (which
// has the cache refresh them on their TTL meanwhile).
func DomainBindings(ctx context.Context, shard client.Reader, domain string) ([]types.NamespacedName, error) {
	return bindings(ctx, shard, client.MatchingFields{DomainIndex: domain}, "domain "+domain)
}

func bindings(ctx context.Context, shard client.Reader, sel client.MatchingFields, what string) ([]types.NamespacedName, error) {
	var list configv1alpha1.ConfigBindingList
	if err := shard.List(ctx, &list, sel); err != nil {
		return nil, fmt.Errorf("finding ConfigBindings of %s: %w", what, err)
	}
	out := make([]types.NamespacedName, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, client.ObjectKeyFromObject(&list.Items[i]))
	}
	return out, nil
}

// DomainChanged requeues every ConfigBinding of a shard that binds keys of
// a domain (DomainBindings).
func (r *Reconciler) DomainChanged(ctx context.Context, q Enqueuer, shard int32, domain string) error {
	reader, ok := r.Shards.Reader(shard)
	if !ok {
		return nil
	}
	keys, err := DomainBindings(ctx, reader, domain)
	if err != nil {
		return err
	}
	for _, k := range keys {
		q.Enqueue(sharding.Request{Shard: shard, NamespacedName: k})
	}
	return nil
}

// AuthorizationChanged requeues the ConfigBindings of a namespace that
// bind a domain, in the shard of the domain if this replica holds it: the
// authorization system's decision for them arrived or changed.
func (r *Reconciler) AuthorizationChanged(ctx context.Context, q Enqueuer, question authzcache.Question) error {
	shard := sharding.ShardOf(question.Domain, r.Shards.Count())
	reader, ok := r.Shards.Reader(shard)
	if !ok {
		return nil
	}
	keys, err := bindings(ctx, reader, client.MatchingFields{DomainIndex: question.Domain}, "domain "+question.Domain)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.Namespace == question.Namespace {
			q.Enqueue(sharding.Request{Shard: shard, NamespacedName: k})
		}
	}
	return nil
}

// BoundKeys lists the external keys the ConfigBindings of a shard's reader
// bind, to warm the cache right after the shard is acquired.
func BoundKeys(ctx context.Context, shard client.Reader) ([]externalcache.Key, error) {
	var list configv1alpha1.ConfigBindingList
	if err := shard.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing the shard's ConfigBindings: %w", err)
	}
	seen := map[externalcache.Key]bool{}
	var keys []externalcache.Key
	for _, cb := range list.Items {
		for _, k := range cb.Spec.Keys {
			key := externalcache.Key{Domain: cb.Spec.Domain, Name: string(k)}
			if !seen[key] {
				seen[key] = true
				keys = append(keys, key)
			}
		}
	}
	return keys, nil
}

// ShardKeys lists the external keys a held shard's ConfigBindings bind
// (BoundKeys).
func (r *Reconciler) ShardKeys(ctx context.Context, shard int32) ([]externalcache.Key, error) {
	reader, ok := r.Shards.Reader(shard)
	if !ok {
		return nil, nil
	}
	return BoundKeys(ctx, reader)
}

// MirrorRequests maps an event of a shard's ExternalDomain mirror to the
// shard's ConfigBindings that read a key whose revision changed (every
// binding of the domain when the mirror's condition changed): a change of
// one key wakes only the bindings of that key.
func MirrorRequests(ctx context.Context, reader client.Reader, oldObj, newObj client.Object) []types.NamespacedName {
	ed, ok := newObj.(*configv1alpha1.ExternalDomain)
	if !ok {
		return nil
	}
	old, _ := oldObj.(*configv1alpha1.ExternalDomain)
	var changed []string
	if old == nil || !conditionsEqual(old.Status.Conditions, ed.Status.Conditions) {
		changed = nil // all keys of the domain
	} else {
		changed = changedKeys(old.Status.Keys, ed.Status.Keys)
		if len(changed) == 0 {
			return nil
		}
	}
	var list configv1alpha1.ConfigBindingList
	seen := map[types.NamespacedName]bool{}
	var out []types.NamespacedName
	add := func(opts ...client.ListOption) {
		list.Items = nil
		if err := reader.List(ctx, &list, opts...); err != nil {
			return
		}
		for i := range list.Items {
			if list.Items[i].Spec.Domain != ed.Spec.Domain {
				continue
			}
			k := client.ObjectKeyFromObject(&list.Items[i])
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	if changed == nil {
		add(client.MatchingFields{DomainIndex: ed.Spec.Domain})
		return out
	}
	for _, name := range changed {
		add(client.MatchingFields{KeyIndex: externalcache.Key{Domain: ed.Spec.Domain, Name: name}.String()})
	}
	return out
}

// changedKeys lists the names whose revision differs (added, removed or
// changed) between two sorted key lists.
func changedKeys(a, b []configv1alpha1.MirroredKey) []string {
	rev := make(map[string]int64, len(a))
	for _, k := range a {
		rev[k.Name] = k.Revision
	}
	var out []string
	for _, k := range b {
		if r, ok := rev[k.Name]; !ok || r != k.Revision {
			out = append(out, k.Name)
		}
		delete(rev, k.Name)
	}
	for name := range rev {
		out = append(out, name)
	}
	return out
}

func conditionsEqual(a, b []metav1.Condition) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || a[i].Status != b[i].Status || a[i].Reason != b[i].Reason {
			return false
		}
	}
	return true
}
