package replica

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"

	"github.com/kshard/kshard/authzcache"
	"github.com/kshard/kshard/authzcache/spicedbsource"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// The authorization systems a replica asks which namespace may read which
// domain (Options.Authorization).
const (
	// AuthorizationNone lets every namespace read every domain.
	AuthorizationNone = "none"
	// AuthorizationSpiceDB asks SpiceDB (authzcache/spicedbsource).
	AuthorizationSpiceDB = "spicedb"
)

// newAuthorization connects to the authorization system the options name
// and returns the cache of its decisions, nil with none, and what releases
// its connection. A decision that arrives or changes requeues the
// namespace's bindings of the domain.
func newAuthorization(opts Options, rec *configbinding.Reconciler, log logr.Logger) (*authzcache.Cache, func(), error) {
	if opts.Authorization != AuthorizationSpiceDB {
		return nil, func() {}, nil
	}
	c, err := spicedbsource.NewClient(opts.SpiceDB)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to SpiceDB: %w", err)
	}
	src, err := spicedbsource.New(c)
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	alog := log.WithName("authorization")
	cache, err := authzcache.New(authzcache.Options{
		Checker: src, Watcher: src, Logger: alog,
		OnChange: func(q authzcache.Question) {
			// rec.Shards is set before the manager starts the cache.
			if err := rec.AuthorizationChanged(context.Background(), rec.Shards, q); err != nil {
				alog.Error(err, "Requeueing the bindings of a changed decision", "namespace", q.Namespace, "domain", q.Domain)
			}
		},
	})
	if err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	return cache, func() { _ = c.Close() }, nil
}
