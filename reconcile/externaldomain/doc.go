// Package externaldomain keeps ExternalDomain objects, mirrors of the
// config center's business domains, current from the change feed: the
// mirror strategy for external data (--external-source=mirror). It is the
// alternative to reading through externalcache: values then live in the API
// server, every replica reads them from an informer, and the config center
// sees one change-feed poll and one fetch per changed key per domain,
// whatever the number of bindings. A domain's sync loop follows the feed
// with externalcache.FeedLoop, the cache's own loop, and fetches through
// the cache's guards (Options.Source), so that the mirror treats the config
// center as the cache does.
//
// A domain's mirror is sharded like the ConfigBindings of the domain: it
// carries their shard label, and only the replica holding that shard writes
// it. The sync loop of a domain runs while its shard is held; DropShard stops
// the loops and waits for them before the shard is released, so two replicas
// never write one mirror. Every write is also guarded by resourceVersion.
package externaldomain
