// Package configcenter is the stand-in for the slow external configuration service that kshard's
// controllers depend on.
//
// It exists so that every claim kshard makes about keeping an external service off the reconcile
// path can be tested and load-tested against a real HTTP server instead of a mock: the server keeps
// domains of keys in memory with etcd-like revisions, serves a long-poll change feed per domain,
// injects latency, errors, 429s with Retry-After and outages on demand, and counts every call by
// caller, domain, route and status so that tests can assert how many calls a client really made.
//
// The package also holds the Client used by controllers and tools, and CacheSource, the adapter that
// lets an externalcache.Cache read from the config center without the cache knowing about HTTP.
package configcenter
