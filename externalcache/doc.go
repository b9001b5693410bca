// Package externalcache keeps a slow external service (a config center, an authorization system,
// a data store) off a controller's reconcile path.
//
// A reconciler asks Get for the keys it needs and never waits: a fresh value is used, a
// soft-expired one is used while it is refreshed in the background (stale-while-revalidate), and
// a missing one is fetched by a bounded pool of workers while the object waits with a condition
// instead of blocking a worker goroutine. The cache tells the controller (OnUpdate) when a key it
// waited for arrives or changes, so the controller requeues exactly the objects that use it. The
// source's change feed invalidates keys as soon as they change, so TTLs only bound staleness while
// the feed is unhealthy (it fails, its long polls come back at once, or its history flaps): the
// keys read then are refreshed on their soft TTL, and their Lookups say so (FeedErr).
//
// Entries live in bigcache, off the Go heap: bigcache stores them in a few large byte slices and
// pointer-free maps, so the garbage collector does not scan a million entries on every cycle and
// GC pauses and CPU stay flat as the cache grows (see README.md for measurements).
//
// Calls to the source go through, in order: dedupe at enqueue (a key already queued or in flight
// is not queued again), single flight per key, a rate limit, a per-call timeout, a circuit
// breaker, and bounded retries with exponential backoff (jittered) that honour the source's
// Retry-After. Fetch offers the same guards to a reader that
// keeps values elsewhere. A cache is partitioned by kshard shard, so releasing a shard drops
// exactly its entries, pending fetches and change-feed subscriptions.
//
// FeedLoop is the one loop that follows a domain's change feed, for the cache and for any other
// consumer (the ExternalDomain mirrors of reconcile/externaldomain), so that every reader of a
// feed handles the source's restarts, flaps, failures and Retry-After, and judges the feed's
// health, by the same rule.
package externalcache
