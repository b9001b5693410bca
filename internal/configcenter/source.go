package configcenter

import (
	"context"
	"errors"
	"fmt"

	"github.com/kshard/kshard/externalcache"
)

// CacheSource lets an externalcache.Cache read from the config center: it is both the cache's
// Source and its Feed. It lives here, not in externalcache, so that the cache knows nothing of
// HTTP or of this service; errors reach the cache through the small interfaces it defines
// (ErrNotFound, StatusCoder, RetryAfterHinter), which StatusError implements.
type CacheSource struct {
	Client *Client
}

var (
	_ externalcache.Source = (*CacheSource)(nil)
	_ externalcache.Feed   = (*CacheSource)(nil)
)

// NewCacheSource wraps a Client.
func NewCacheSource(c *Client) *CacheSource { return &CacheSource{Client: c} }

// Fetch reads a key; a missing domain or key is reported as externalcache.ErrNotFound.
func (s *CacheSource) Fetch(ctx context.Context, key externalcache.Key) (externalcache.Value, error) {
	v, err := s.Client.Get(ctx, key.Domain, key.Name)
	if errors.Is(err, ErrNotFound) {
		return externalcache.Value{}, fmt.Errorf("%w: %w", externalcache.ErrNotFound, err)
	}
	if errors.Is(err, ErrInvalidAnswer) {
		return externalcache.Value{}, fmt.Errorf("%w: %w", externalcache.ErrInvalidValue, err)
	}
	if err != nil {
		return externalcache.Value{}, err
	}
	return externalcache.Value{Data: []byte(v.Value), Revision: v.Revision}, nil
}

// Changes polls the domain's change feed.
func (s *CacheSource) Changes(ctx context.Context, domain string, since int64) (externalcache.ChangeSet, error) {
	cs, err := s.Client.Changes(ctx, domain, since)
	if err != nil {
		return externalcache.ChangeSet{}, err
	}
	out := externalcache.ChangeSet{Revision: cs.Revision, Epoch: cs.Epoch, Changes: make([]externalcache.Change, len(cs.Changes))}
	for i, c := range cs.Changes {
		out.Changes[i] = externalcache.Change{Name: c.Key, Revision: c.Revision, Deleted: c.Deleted}
	}
	return out, nil
}
