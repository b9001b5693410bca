package shardcache

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/sharding"
)

// Options configure a Cache.
type Options struct {
	// Cache configures the external cache. Source is required; MaxShards
	// is the shards' count and OnUpdate and OnFeedHealth are the Cache's
	// own: values set here are replaced.
	Cache externalcache.Options
	// Keys lists the keys the objects of one shard read, from a reader of
	// that shard's objects only: the cache fetches them for the shard
	// once its informers synced, so the first reconciles find their values
	// fetched. Nil warms nothing.
	Keys func(ctx context.Context, shard client.Reader) ([]externalcache.Key, error)
	// Readers lists the objects of one shard that read a key: they are
	// requeued when its value arrives, changes or fails. Required.
	Readers func(ctx context.Context, shard client.Reader, key externalcache.Key) ([]types.NamespacedName, error)
	// DomainReaders lists the objects of one shard that read keys of a
	// domain: they are requeued when the domain's change feed becomes
	// unhealthy or heals, so that they can say so. Nil requeues none.
	DomainReaders func(ctx context.Context, shard client.Reader, domain string) ([]types.NamespacedName, error)
	// Logger receives the cache's logs, and the external cache's unless Cache.Logger is set.
	// Default: discard.
	Logger logr.Logger
}

// Cache is an external cache whose shards are the tenures of a sharded
// controller's shards on this replica.
type Cache struct {
	opts Options
	log  logr.Logger
	// binding is set by Bind; every read loads it without a lock, as a
	// reconcile reads a value per key.
	binding atomic.Pointer[binding]
}

// binding is what Bind connects: the external cache and the shards.
type binding struct {
	store  *externalcache.Cache
	shards sharding.Shards
}

// New validates the options and returns a Cache to Bind.
func New(opts Options) (*Cache, error) {
	if opts.Cache.Source == nil {
		return nil, errors.New("shard cache: Cache.Source is required")
	}
	if opts.Readers == nil {
		return nil, errors.New("shard cache: Readers is required")
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	return &Cache{opts: opts, log: opts.Logger}, nil
}

// Bind creates the external cache for the shards' count, adds it to the
// manager, and reads the shards from now on. Call it once, before the
// manager starts.
func (c *Cache) Bind(mgr manager.Manager, shards sharding.Shards) error {
	co := c.opts.Cache
	co.MaxShards, co.OnUpdate, co.OnFeedHealth = int(shards.Count()), c.changed, c.feedHealthChanged
	if co.Logger.GetSink() == nil {
		co.Logger = c.log
	}
	store, err := externalcache.New(co)
	if err != nil {
		return fmt.Errorf("shard cache: %w", err)
	}
	c.binding.Store(&binding{store: store, shards: shards})
	if err := mgr.Add(store); err != nil {
		return fmt.Errorf("shard cache: %w", err)
	}
	return nil
}

// bound returns the store and the shards, once Bind ran.
func (c *Cache) bound() (*externalcache.Cache, sharding.Shards) {
	if b := c.binding.Load(); b != nil {
		return b.store, b.shards
	}
	return nil, nil
}

// Get returns a key's value for a shard's reconcile without blocking: fresh,
// stale with a refresh under way, or pending with a fetch queued, whose
// arrival requeues the shard's readers of the key.
func (c *Cache) Get(shard int32, key externalcache.Key) externalcache.Lookup {
	store, _ := c.bound()
	if store == nil {
		return externalcache.Lookup{State: externalcache.StatePending, Err: errors.New("shard cache not bound")}
	}
	return store.Get(shard, key)
}

// KeyExists answers from the change feeds alone whether a key exists
// (externalcache.Cache.KeyExists), for an admission check that must not
// call the service on the request path. Unknown before Bind.
func (c *Cache) KeyExists(key externalcache.Key) (exists, known bool) {
	store, _ := c.bound()
	if store == nil {
		return false, false
	}
	return store.KeyExists(key)
}

// Domains lists the domains a held shard's objects have read: what the
// cache keeps a change feed and entries for (externalcache.Cache.Domains).
// None before Bind.
func (c *Cache) Domains(shard int32) []string {
	store, _ := c.bound()
	if store == nil {
		return nil
	}
	return store.Domains(shard)
}

// ReleaseDomain drops what the cache keeps for a domain of a shard, once
// the shard's last object that reads it is gone, so that the feeds and
// entries follow the domains in use (externalcache.Cache.ReleaseDomain).
func (c *Cache) ReleaseDomain(shard int32, domain string) {
	if store, _ := c.bound(); store != nil {
		store.ReleaseDomain(shard, domain)
	}
}

// OnAcquire is the runtime's hook (sharding.Options.OnAcquire): the shard
// is added to the cache at once (a new tenure: nothing of an earlier one is
// served), and warmed with its objects' keys once its informers synced,
// unless the tenure (ctx) ended first.
func (c *Cache) OnAcquire(ctx context.Context, shard int32) {
	store, shards := c.bound()
	if store == nil {
		c.log.Error(errors.New("not bound"), "Shard acquired before the shard cache was bound", "shard", shard)
		return
	}
	if err := store.AddShard(shard); err != nil {
		c.log.Error(err, "Adding a shard to the external cache", "shard", shard)
		return
	}
	if c.opts.Keys == nil {
		return
	}
	go func() {
		if !shards.WaitForSync(ctx, shard) {
			return
		}
		reader, ok := shards.Reader(shard)
		if !ok {
			return
		}
		keys, err := c.opts.Keys(ctx, reader)
		if err == nil && len(keys) > 0 {
			err = store.Warm(ctx, shard, keys...)
		}
		if err != nil && ctx.Err() == nil {
			c.log.Error(err, "Warming the external cache", "shard", shard)
		}
	}()
}

// OnRelease is the runtime's hook (sharding.Options.OnRelease): the shard's
// entries, fetches and share of the change feeds go.
func (c *Cache) OnRelease(shard int32) {
	if store, _ := c.bound(); store != nil {
		store.DropShard(shard)
	}
}

// changed requeues the shard's readers of a key whose value arrived,
// changed or failed.
func (c *Cache) changed(shard int32, key externalcache.Key) {
	if err := c.requeue(shard, func(ctx context.Context, r client.Reader) ([]types.NamespacedName, error) {
		return c.opts.Readers(ctx, r, key)
	}); err != nil {
		c.log.Error(err, "Requeueing the readers of a changed key", "shard", shard, "key", key)
	}
}

// feedHealthChanged requeues the shard's readers of a domain whose change
// feed became unhealthy or healed.
func (c *Cache) feedHealthChanged(shard int32, domain string) {
	if c.opts.DomainReaders == nil {
		return
	}
	if err := c.requeue(shard, func(ctx context.Context, r client.Reader) ([]types.NamespacedName, error) {
		return c.opts.DomainReaders(ctx, r, domain)
	}); err != nil {
		c.log.Error(err, "Requeueing the readers of a domain whose change feed's health changed", "shard", shard, "domain", domain)
	}
}

func (c *Cache) requeue(shard int32, readers func(context.Context, client.Reader) ([]types.NamespacedName, error)) error {
	_, shards := c.bound()
	if shards == nil {
		return nil
	}
	reader, ok := shards.Reader(shard)
	if !ok {
		return nil
	}
	keys, err := readers(context.Background(), reader)
	if err != nil {
		return err
	}
	for _, k := range keys {
		shards.Enqueue(sharding.Request{Shard: shard, NamespacedName: k})
	}
	return nil
}
