package configbinding

import (
	"context"
	"errors"
	"time"

	"github.com/kshard/kshard/externalcache"
)

// Values is where Reconcile gets key values from. The cached implementation
// never blocks; the direct one is the synchronous baseline that benchmarks
// compare against.
type Values interface {
	Get(ctx context.Context, shard int32, key externalcache.Key) externalcache.Lookup
}

// CachedValues reads through an externalcache.Cache: no network I/O on the
// reconcile path.
type CachedValues struct{ Cache *externalcache.Cache }

// Get implements Values.
func (v CachedValues) Get(_ context.Context, shard int32, key externalcache.Key) externalcache.Lookup {
	return v.Cache.Get(shard, key)
}

// DirectValues calls the source synchronously, one call per key per
// reconcile (--external-mode=direct). It exists only as a baseline: a slow
// or failing source stalls every worker.
type DirectValues struct {
	Source  externalcache.Source
	Timeout time.Duration
}

// Get implements Values.
func (v DirectValues) Get(ctx context.Context, _ int32, key externalcache.Key) externalcache.Lookup {
	if v.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, v.Timeout)
		defer cancel()
	}
	val, err := v.Source.Fetch(ctx, key)
	switch {
	case err == nil:
		return externalcache.Lookup{Value: val.Data, Revision: val.Revision, FetchedAt: time.Now(), State: externalcache.StateFresh}
	case errors.Is(err, externalcache.ErrNotFound):
		return externalcache.Lookup{State: externalcache.StateNotFound, FetchedAt: time.Now()}
	default:
		return externalcache.Lookup{State: externalcache.StatePending, Err: err}
	}
}
