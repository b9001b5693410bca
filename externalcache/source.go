package externalcache

import (
	"context"
	"errors"
	"time"
)

// Key names one value of the external service: a key within a business domain. The domain is
// what kshard shards by and what the change feed is subscribed per.
type Key struct {
	Domain string
	Name   string
}

// String renders the key as domain/name for logs and errors.
func (k Key) String() string { return k.Domain + "/" + k.Name }

// maxKeyBytes bounds Domain plus Name, so that an entry's size is bounded by its value alone.
const maxKeyBytes = 512

func (k Key) validate() error {
	switch {
	case k.Domain == "" || k.Name == "":
		return errors.Join(ErrInvalidKey, errors.New("domain and name must not be empty"))
	case len(k.Domain)+len(k.Name) > maxKeyBytes:
		return errors.Join(ErrInvalidKey, errors.New("domain and name are longer than 512 bytes"))
	}
	for i := 0; i < len(k.Domain); i++ {
		if k.Domain[i] == 0 {
			return errors.Join(ErrInvalidKey, errors.New("domain contains a NUL byte"))
		}
	}
	return nil
}

// cacheKey is the key's name in bigcache; NUL cannot occur in a domain, so it is unambiguous.
func (k Key) cacheKey() string { return k.Domain + "\x00" + k.Name }

// Value is what a Source answers for a key. Revision orders values of the same key: a change
// feed entry with a higher revision means the cached value is outdated.
type Value struct {
	Data     []byte
	Revision int64
}

// Change says that a key of a domain changed at a revision (or was deleted).
type Change struct {
	Name     string
	Revision int64
	Deleted  bool
}

// ChangeSet answers a change-feed poll. Revision is where the next poll starts. A Revision lower
// than the one asked for, or an Epoch different from the previous answer's, means the source lost
// its history (it restarted), and the cache resynchronises the domain.
type ChangeSet struct {
	Revision int64
	Changes  []Change
	// Epoch optionally names the source's history; empty means the source has none.
	Epoch string
}

// Source reads keys from the external service. Fetch must honour ctx; it returns an error
// wrapping ErrNotFound when the key does not exist. Errors implementing StatusCoder and
// RetryAfterHinter let the cache tell retryable failures from the caller's mistakes and honour
// the service's Retry-After.
type Source interface {
	Fetch(ctx context.Context, key Key) (Value, error)
}

// BatchSource is a Source that reads several keys of one domain in one call, at one revision of
// the service. The cache then fetches the queued keys of a domain together, up to
// Options.MaxBatch a call and one token of the rate limit each: a new owner of a shard asks for
// every key its objects read at once, one call per key costs the service thousands of calls in
// a handover at 100,000 objects, and the rate limit spaces them over seconds. FetchBatch answers
// names[i] in its i-th result as Fetch would answer it (a key that does not exist with an error
// wrapping ErrNotFound); its error is the whole call's, every key's.
type BatchSource interface {
	Source
	FetchBatch(ctx context.Context, domain string, names []string) ([]Fetched, error)
}

// Fetched is a BatchSource's answer for one key: its value, or what Fetch would have failed with.
type Fetched struct {
	Value Value
	Err   error
}

// Feed is the external service's change feed: a long poll that returns when keys of the domain
// changed after since, or after a while with no changes. A Source without a feed still works;
// freshness is then bounded by the TTLs alone.
type Feed interface {
	Changes(ctx context.Context, domain string, since int64) (ChangeSet, error)
}

// StatusCoder is implemented by source errors that carry the service's status, with HTTP
// meaning: 429, 408 and 5xx are failures worth retrying that count against the circuit breaker;
// other 4xx are the caller's mistakes, not retried and not held against the service.
type StatusCoder interface {
	StatusCode() int
}

// RetryAfterHinter is implemented by source errors that carry the time the service asked
// callers to wait (an HTTP Retry-After). The cache makes no call to the service before it.
type RetryAfterHinter interface {
	RetryAfterHint() time.Duration
}

var (
	// ErrNotFound is wrapped by Source errors for keys that do not exist; such keys are cached
	// negatively for Options.NegativeTTL.
	ErrNotFound = errors.New("key not found")
	// ErrEntryTooLarge is wrapped by the error of a key whose value cannot be cached because it
	// is larger than Options.MaxEntryBytes; the message names the key and the size.
	ErrEntryTooLarge = errors.New("entry too large")
	// ErrCircuitOpen is wrapped by fetch errors while the circuit breaker rejects calls; the key
	// is retried after the breaker's timeout.
	ErrCircuitOpen = errors.New("circuit breaker open")
	// ErrInvalidValue is wrapped by a Source's error when the service answered for the key with
	// something unreadable: that key fails (retried after FailureRetryInterval) but the service
	// is not counted as failing, so one bad key cannot open the breaker for every key.
	ErrInvalidValue = errors.New("invalid value")
	// ErrRejected is wrapped by a Source's or Feed's error when the service understood the
	// request and refused it as the caller's mistake, whatever its protocol (an HTTP 4xx, a
	// gRPC InvalidArgument, PermissionDenied or Unauthenticated): the call is not retried
	// soon, and the service is not counted as failing (a wrong password must not open the
	// circuit breaker for every key). Any other error is a failure of the service, retried
	// and counted: timeouts, unavailable, overloaded. StatusCoder says the same in HTTP's terms.
	ErrRejected = errors.New("rejected by the service")
	// ErrRetryAfterHold is carried by lookups of keys waiting while the source's Retry-After
	// (capped at Options.MaxRetryAfter) holds every call: the wait is visible, not silent.
	ErrRetryAfterHold = errors.New("the config center asked to wait (Retry-After)")
	// ErrQueueFull is reported by Get when the fetch queue is full; the next Get tries again.
	ErrQueueFull = errors.New("fetch queue full")
	// ErrShardNotHeld: Get, Wait or Warm for a shard that AddShard did not add, or that
	// DropShard dropped.
	ErrShardNotHeld = errors.New("shard not held by the external cache")
	// ErrShardDropped releases waiters of a shard that DropShard dropped.
	ErrShardDropped = errors.New("shard dropped")
	// ErrTooManyShards is reported when a call would hold more than Options.MaxShards shards.
	ErrTooManyShards = errors.New("too many shards")
	// ErrInvalidKey is reported for keys the cache cannot store.
	ErrInvalidKey = errors.New("invalid key")
	// ErrEvicted is carried by a Lookup of a key whose value the cache evicted to make room for
	// others while it was still servable: the values the replica reads do not fit in
	// Options.MaxBytes together. The key is fetched again; that arrival is not notified (the
	// value did not change), so a caller that waits for it looks again later.
	ErrEvicted = errors.New("value evicted for room")
	// ErrFeedUnhealthy is wrapped by Lookup.FeedErr while the change feed of the key's domain is
	// unhealthy (see FeedHealthOptions); the error says why.
	ErrFeedUnhealthy = errors.New("change feed unhealthy")
	// ErrStopped releases waiters when the cache stops.
	ErrStopped = errors.New("cache stopped")
)

// errDomainReleased ends the fetches of a domain that ReleaseDomain released; a Wait on one
// reads the key again.
var errDomainReleased = errors.New("domain released")
