package configbinding

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/sharding"
)

// KeyIndex indexes ConfigBindings by the external keys they bind
// ("domain/key"), so a changed key finds its objects in the shard's cache
// instead of the external cache tracking who waits for what.
const KeyIndex = "kshard.dev/external-key"

// Index is the shard-cache index the reconciler's key mapping needs.
func Index() sharding.Index {
	return sharding.Index{
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
	}
}

// Enqueuer requests reconciles; *sharding.Replica implements it.
type Enqueuer interface {
	Enqueue(sharding.Request)
}

// KeyChanged requeues every ConfigBinding of a shard that binds a key: the
// external cache calls it when a value arrives, changes, or fails.
func (r *Reconciler) KeyChanged(ctx context.Context, q Enqueuer, shard int32, key externalcache.Key) error {
	reader, ok := r.Shards.Reader(shard)
	if !ok {
		return nil
	}
	var list configv1alpha1.ConfigBindingList
	if err := reader.List(ctx, &list, client.MatchingFields{KeyIndex: key.String()}); err != nil {
		return fmt.Errorf("finding ConfigBindings of key %s: %w", key, err)
	}
	for i := range list.Items {
		q.Enqueue(sharding.Request{Shard: shard, NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return nil
}

// ShardKeys lists the external keys a shard's ConfigBindings bind, to warm
// the cache right after the shard is acquired.
func (r *Reconciler) ShardKeys(ctx context.Context, shard int32) ([]externalcache.Key, error) {
	reader, ok := r.Shards.Reader(shard)
	if !ok {
		return nil, nil
	}
	var list configv1alpha1.ConfigBindingList
	if err := reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing shard %d: %w", shard, err)
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
