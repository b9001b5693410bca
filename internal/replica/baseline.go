package replica

import (
	"context"
	"errors"
	"time"

	"github.com/kshard/kshard/externalcache"
)

// The baseline kshard's external cache is measured against: calls to the
// config center inside Reconcile (--external-mode=direct). The other
// baseline, one active replica for everything (--sharding=off), is
// sharding.Single.

// directValues calls the source synchronously, one call per key per
// reconcile (--external-mode=direct). It exists only as a baseline: a slow
// or failing source stalls every worker.
type directValues struct {
	Source  externalcache.Source
	Timeout time.Duration
}

// Get implements configbinding.Values.
func (v directValues) Get(ctx context.Context, _ int32, key externalcache.Key) externalcache.Lookup {
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
