package replica

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/reconcile/externaldomain"
	"github.com/kshard/kshard/shardcache"
	"github.com/kshard/kshard/sharding"
)

// externalSource is one way of bringing the config center's values to the
// reconciler: each replica's cache, the ExternalDomain mirrors, or direct
// calls (the baseline). Run picks one from the options and wires it to the
// shards through this interface only.
type externalSource interface {
	// owns are kinds a shard's cache watches beyond ConfigMaps.
	owns() []sharding.Kind
	// bind connects the source to the replica's shards, once they exist
	// and before the manager starts.
	bind(mgr manager.Manager, shards sharding.Shards) error
	// values is what Reconcile reads.
	values() configbinding.Values
	// initialList filters the create events of a cache's initial list of
	// ConfigBindings, whose shards shardOf gives.
	initialList(shardOf func(client.Object) (int32, bool)) predicate.Predicate
	// knowledge answers the admission pre-check.
	knowledge() configbinding.KeyKnowledge
	// domains is the per-domain state values keep, which the reconciler
	// releases with a domain's last binding; nil when there is none.
	domains() configbinding.Domains
	// acquired and released bracket one tenure of a shard on this replica
	// (sharding's OnAcquire and OnRelease); acquired must not block, and
	// ctx ends with the tenure.
	acquired(ctx context.Context, shard int32)
	released(shard int32)
}

// newSource creates the external source the options name.
func newSource(opts Options, cc configCenter, rec *configbinding.Reconciler, log logr.Logger) (externalSource, error) {
	switch {
	case opts.ExternalSource == SourceMirror:
		// The mirror keeps the values; the cache holds none of them, and
		// only guards the mirror's fetches (Cache.Fetch).
		co := opts.Cache
		co.Source, co.Feed, co.Logger = cc, nil, log.WithName("externalcache")
		c, err := externalcache.New(co)
		if err != nil {
			return nil, fmt.Errorf("creating the external cache the mirror fetches through: %w", err)
		}
		return &mirrorSource{opts: opts, cc: cc, cache: c, rec: rec, log: log.WithName("mirror")}, nil
	case opts.ExternalMode == ExternalCache:
		co := opts.Cache
		co.Source, co.Feed = cc, cc
		c, err := shardcache.New(shardcache.Options{Cache: co, Keys: configbinding.BoundKeys,
			Readers: configbinding.KeyBindings, DomainReaders: configbinding.DomainBindings, Logger: log.WithName("externalcache")})
		if err != nil {
			return nil, fmt.Errorf("creating external cache: %w", err)
		}
		return &cacheSource{cache: c}, nil
	}
	return directSource{cc: cc}, nil
}

// cacheSource keeps values in each replica's off-heap cache, for the shards
// it holds (shardcache: the store follows the shards' tenures, a change of
// a key requeues the bindings that use it).
type cacheSource struct{ cache *shardcache.Cache }

func (s *cacheSource) owns() []sharding.Kind { return nil }

func (s *cacheSource) bind(mgr manager.Manager, shards sharding.Shards) error {
	return s.cache.Bind(mgr, shards)
}

func (s *cacheSource) values() configbinding.Values {
	return configbinding.CachedValues{Cache: s.cache}
}

// initialList drops a Ready binding's first event while its keys are on
// their way: their arrival requeues it.
func (s *cacheSource) initialList(shardOf func(client.Object) (int32, bool)) predicate.Predicate {
	return configbinding.ColdCachePredicate(s.cache, shardOf)
}

func (s *cacheSource) knowledge() configbinding.KeyKnowledge {
	return configbinding.CacheKnowledge{Cache: s.cache}
}

func (s *cacheSource) domains() configbinding.Domains {
	return configbinding.CachedDomains{Cache: s.cache}
}

func (s *cacheSource) acquired(ctx context.Context, shard int32) { s.cache.OnAcquire(ctx, shard) }
func (s *cacheSource) released(shard int32)                      { s.cache.OnRelease(shard) }

// mirrorSource keeps values in ExternalDomain objects, one per domain,
// written by the domain's shard holder and read through the shard caches.
type mirrorSource struct {
	opts      Options
	cc        configCenter
	cache     *externalcache.Cache
	rec       *configbinding.Reconciler
	log       logr.Logger
	shards    sharding.Shards
	mirror    *externaldomain.Mirror
	apiReader client.Reader
}

func (s *mirrorSource) owns() []sharding.Kind {
	return []sharding.Kind{{Object: &configv1alpha1.ExternalDomain{}, Requests: configbinding.MirrorRequests}}
}

func (s *mirrorSource) bind(mgr manager.Manager, shards sharding.Shards) error {
	m, err := externaldomain.New(externaldomain.Options{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Source: s.cache, Feed: s.cc, Shards: shards, Ring: s.opts.Ring,
		MaxBytes: s.opts.MirrorMaxBytes, MaxRetryAfter: s.opts.Cache.MaxRetryAfter, Log: s.log,
		FeedRetry: s.opts.Cache.FeedRetry, FeedHealth: s.opts.Cache.FeedHealth, RefreshInterval: s.opts.Cache.SoftTTL,
	})
	if err != nil {
		return err
	}
	s.shards, s.mirror, s.apiReader = shards, m, mgr.GetAPIReader()
	if err := mgr.Add(s.cache); err != nil {
		return err
	}
	return mgr.Add(m)
}

func (s *mirrorSource) values() configbinding.Values {
	return configbinding.MirrorValues{Shards: s.shards, Mirrors: s.mirror}
}

// initialList passes every event: a mirror's first sight requeues its
// domain's bindings, but the mirror may be in the shard's cache already.
func (s *mirrorSource) initialList(func(client.Object) (int32, bool)) predicate.Predicate {
	return predicate.Funcs{}
}

func (s *mirrorSource) knowledge() configbinding.KeyKnowledge {
	return configbinding.MirrorKnowledge{Shards: s.shards, APIReader: s.apiReader}
}

func (s *mirrorSource) domains() configbinding.Domains { return s.mirror }

// acquired keeps the mirrors of the shard's domains current once its
// informers know which domains its bindings use, and deletes the mirrors
// an earlier holder left of domains no binding uses any more.
func (s *mirrorSource) acquired(ctx context.Context, shard int32) {
	go func() {
		if !s.shards.WaitForSync(ctx, shard) {
			return
		}
		keys, err := s.rec.ShardKeys(ctx, shard)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error(err, "Listing the domains of a shard", "shard", shard)
			}
			return
		}
		for _, k := range keys {
			s.mirror.Ensure(shard, k.Domain)
		}
		if err := s.rec.CollectUnusedDomains(ctx, shard); err != nil && ctx.Err() == nil {
			s.log.Error(err, "Collecting the mirrors of domains no binding of the shard reads", "shard", shard)
		}
	}()
}

// released stops the shard's mirror loops before its Lease is released:
// the next holder is the only writer of the shard's mirrors.
func (s *mirrorSource) released(shard int32) { s.mirror.DropShard(shard) }

// directSource calls the config center inside Reconcile: the synchronous
// baseline the others are measured against. It keeps nothing per shard.
type directSource struct{ cc configCenter }

func (directSource) owns() []sharding.Kind { return nil }

func (directSource) bind(manager.Manager, sharding.Shards) error { return nil }

func (s directSource) values() configbinding.Values {
	return directValues{Source: s.cc, Timeout: 10 * time.Second}
}

// initialList passes every event: the direct baseline waits for its values
// inside Reconcile.
func (directSource) initialList(func(client.Object) (int32, bool)) predicate.Predicate {
	return predicate.Funcs{}
}

// knowledge: the direct baseline knows nothing without calling the config
// center, which the pre-check never does; every key is unknown.
func (directSource) knowledge() configbinding.KeyKnowledge { return unknownKeys{} }

// domains: the direct baseline keeps nothing per domain.
func (directSource) domains() configbinding.Domains { return nil }

// unknownKeys knows no key: the pre-check allows every binding, with a
// warning.
type unknownKeys struct{}

func (unknownKeys) Exists(context.Context, externalcache.Key) (exists, known bool) {
	return false, false
}

func (directSource) acquired(context.Context, int32) {}
func (directSource) released(int32)                  {}
