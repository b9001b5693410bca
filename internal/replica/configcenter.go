package replica

import (
	"fmt"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configcenter"
)

// The kinds of config center a replica reads (Options.ConfigCenter).
const (
	// ConfigCenterEtcd is an etcd v3 key space: <prefix>/<domain>/<name>
	// (externalcache/etcdsource), the store users run.
	ConfigCenterEtcd = "etcd"
	// ConfigCenterHTTP is kshard's stand-in protocol (internal/configcenter).
	ConfigCenterHTTP = "http"
)

// configCenter is what the cache and the mirror read values through and
// follow changes with.
type configCenter interface {
	externalcache.Source
	externalcache.Feed
}

// newConfigCenter connects to the config center the options name; close
// releases its connections.
func newConfigCenter(opts Options) (center configCenter, closeFn func(), err error) {
	if opts.ConfigCenter == ConfigCenterEtcd {
		c, err := etcdsource.NewClient(opts.Etcd)
		if err != nil {
			return nil, nil, fmt.Errorf("connecting to the config center's etcd: %w", err)
		}
		s, err := etcdsource.New(etcdsource.Options{Client: c, Prefix: opts.EtcdPrefix, WatchPerPoll: opts.EtcdWatchPerPoll})
		if err != nil {
			_ = c.Close()
			return nil, nil, err
		}
		return s, func() { _ = c.Close() }, nil
	}
	c, err := configcenter.NewClient(configcenter.ClientOptions{BaseURL: opts.ConfigCenterURL, Token: opts.ConfigCenterToken, Caller: opts.Identity})
	if err != nil {
		return nil, nil, fmt.Errorf("creating config center client: %w", err)
	}
	return configcenter.NewCacheSource(c), func() {}, nil
}
