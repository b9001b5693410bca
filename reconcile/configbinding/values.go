package configbinding

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/reconcile/externaldomain"
)

// Values is where Reconcile gets key values from. The cached implementation
// never blocks; the direct one is the synchronous baseline that benchmarks
// compare against.
type Values interface {
	Get(ctx context.Context, shard int32, key externalcache.Key) externalcache.Lookup
}

// CachedValues reads through an external cache (a shardcache.Cache): no
// network I/O on the reconcile path.
type CachedValues struct{ Cache Fetcher }

// Get implements Values.
func (v CachedValues) Get(_ context.Context, shard int32, key externalcache.Key) externalcache.Lookup {
	return v.Cache.Get(shard, key)
}

// CachedDomains releases the cache's per-domain state (Domains).
type CachedDomains struct{ Cache DomainCache }

// DomainCache is what an external cache keeps per domain of a shard: a
// change feed and entries. *shardcache.Cache and *externalcache.Cache
// implement it.
type DomainCache interface {
	Domains(shard int32) []string
	ReleaseDomain(shard int32, domain string)
}

// Domains implements Domains.
func (d CachedDomains) Domains(_ context.Context, shard int32) ([]string, error) {
	return d.Cache.Domains(shard), nil
}

// ReleaseDomain implements Domains; the cache writes nothing to the API
// server, so the write context only says the shard is held.
func (d CachedDomains) ReleaseDomain(_ context.Context, shard int32, domain string) error {
	d.Cache.ReleaseDomain(shard, domain)
	return nil
}

// ErrDomainTooLarge is carried by lookups of a domain whose mirror cannot
// hold it; the ConfigBinding says DomainTooLarge instead of waiting.
var ErrDomainTooLarge = errors.New("domain too large for its mirror")

// Mirrors keeps a domain's mirror current while its shard is held;
// *externaldomain.Mirror implements it.
type Mirrors interface {
	Ensure(shard int32, domain string)
	// Missing says the shard's cache has no mirror of the domain: a
	// mirror deleted while its loop ran is written again.
	Missing(shard int32, domain string)
}

// MirrorValues reads values from the shard's informer cache of
// ExternalDomain mirrors (--external-source=mirror): no network I/O on the
// reconcile path, and no per-replica copy of the values beyond the informer.
type MirrorValues struct {
	Shards  Shards
	Mirrors Mirrors
}

// Get implements Values.
func (v MirrorValues) Get(ctx context.Context, shard int32, key externalcache.Key) externalcache.Lookup {
	reader, ok := v.Shards.Reader(shard)
	if !ok {
		return externalcache.Lookup{State: externalcache.StatePending}
	}
	v.Mirrors.Ensure(shard, key.Domain)
	var ed configv1alpha1.ExternalDomain
	if err := reader.Get(ctx, types.NamespacedName{Name: key.Domain}, &ed); err != nil {
		// Not mirrored yet, or deleted: the mirror's creation requeues the
		// binding.
		if apierrors.IsNotFound(err) {
			v.Mirrors.Missing(shard, key.Domain)
		}
		return externalcache.Lookup{State: externalcache.StatePending}
	}
	synced := meta.FindStatusCondition(ed.Status.Conditions, externaldomain.ConditionSynced)
	if synced == nil {
		return externalcache.Lookup{State: externalcache.StatePending}
	}
	if synced.Reason == externaldomain.ReasonTooLarge {
		return externalcache.Lookup{State: externalcache.StatePending, Err: fmt.Errorf("%w: %s", ErrDomainTooLarge, synced.Message)}
	}
	var err, feedErr error
	switch {
	case synced.Reason == externaldomain.ReasonFeedUnhealthy:
		// Every key is there, refreshed on an interval instead of by the
		// feed: current, but maybe late, as the cache's values on their
		// soft TTL.
		feedErr = fmt.Errorf("%w: %s", externalcache.ErrFeedUnhealthy, synced.Message)
	case synced.Status != metav1.ConditionTrue:
		err = errors.New(synced.Message)
	}
	fetched := time.Time{}
	if ed.Status.LastSyncTime != nil {
		fetched = ed.Status.LastSyncTime.Time
	}
	i, found := slices.BinarySearchFunc(ed.Status.Keys, key.Name, func(k configv1alpha1.MirroredKey, name string) int {
		return strings.Compare(k.Name, name)
	})
	if !found {
		return externalcache.Lookup{State: externalcache.StateNotFound, FetchedAt: fetched, Err: err, FeedErr: feedErr}
	}
	k := ed.Status.Keys[i]
	state := externalcache.StateFresh
	if err != nil {
		state = externalcache.StateStale
	}
	return externalcache.Lookup{Value: []byte(k.Value), Revision: k.Revision, FetchedAt: fetched, State: state, Err: err, FeedErr: feedErr}
}
