package externalcache

import (
	"errors"
	"fmt"
	"time"

	"github.com/allegro/bigcache/v3"
	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

const mib = 1 << 20

// Options configures a Cache. Only Source is required; every other field has a documented
// default chosen for a controller replica holding up to 64 shards.
type Options struct {
	// Source reads keys. Required.
	Source Source
	// Feed is the change feed. Optional: without it values refresh on TTL expiry only. A Source
	// that also implements Feed is not used as one unless set here.
	Feed Feed
	// OnUpdate is called once per arrival, change, negative result or first failure of a fetched
	// key, from a single dispatcher goroutine, never from a fetch worker. It must be quick (enqueue
	// events); while it runs, further notifications are coalesced per key. See NotifyQueueSize.
	OnUpdate func(shard int32, key Key)
	// OnFeedHealth is called, like OnUpdate and from the same goroutine, for every held shard that
	// uses a domain when the domain's change feed becomes unhealthy, changes its reason, or heals
	// (see FeedHealthOptions). The caller reads the domain's keys again: while the feed is
	// unhealthy their Lookups carry FeedErr, and a key read (or fetched) then is refreshed on its
	// soft TTL, which a key the cache no longer holds cannot be without a read. Optional.
	OnFeedHealth func(shard int32, domain string)
	// Logger receives the cache's logs. Default: discard.
	Logger logr.Logger
	// Clock is the clock of TTLs: when a value was fetched and when it expires. Default: the
	// system clock. Tests inject one to expire entries without waiting; timers for retries and
	// the breaker always use real time.
	Clock clock.PassiveClock

	// MaxBytes bounds the bytes of all entries across all shards (whole MiB, at least 1).
	// Default 256 MiB.
	//
	// The held shards share it: one bigcache holds every held shard's entries, each key prefixed
	// with its shard's tenure, so a replica holding few shards may use all of it for them, and a
	// binding's values evict each other only when the values the replica reads do not fit (their
	// Lookups then carry ErrEvicted). Dropping a shard stays O(1): a later tenure has another
	// prefix, and a background sweep deletes the dropped tenure's entries.
	MaxBytes int64
	// MaxShards is the most shards held at once; AddShard of one more reports ErrTooManyShards.
	// Default 64, kshard's default shard count, so a single replica may hold every shard.
	MaxShards int
	// MaxEntryBytes bounds one value. Larger values are refused with ErrEntryTooLarge. It must
	// fit in half of one bigcache internal shard (MaxBytes/InternalShards), which New checks.
	// Default 64 KiB.
	MaxEntryBytes int
	// InternalShards is the number of bigcache shards (lock stripes) of the store, a power of
	// two. Each holds MaxBytes/InternalShards and evicts its oldest entries when full, so fewer,
	// larger ones let more of one binding's large values live together. Default 16: 16 MiB each
	// at the default MaxBytes, and an initial allocation of 80 KiB (ExpectedEntryBytes times
	// bigcache's floor of 10 entries per internal shard).
	InternalShards int
	// ExpectedEntries and ExpectedEntryBytes size bigcache's initial allocation; it doubles on
	// demand up to MaxBytes. Defaults 160 and 512 (bigcache's floor of 10 entries per internal
	// shard).
	ExpectedEntries    int
	ExpectedEntryBytes int
	// CleanWindow is how often bigcache drops entries older than the hard TTL. Default 1m.
	CleanWindow time.Duration

	// SoftTTL is how long a value is served as fresh. After it, Get serves it as stale and
	// refreshes it in the background. Default 5m, or half of HardTTL when that is shorter.
	SoftTTL time.Duration
	// TTLJitter spreads SoftTTL by ±TTLJitter (a fraction) so keys fetched together do not
	// expire together. Default 0.1.
	TTLJitter float64
	// HardTTL is how long a value may be served at all, stale included. Default 1h.
	HardTTL time.Duration
	// NegativeTTL is how long a not-found answer is cached. Default 30s.
	NegativeTTL time.Duration
	// MaxRetryAfter caps a Retry-After the source sends: while it lasts no call is made, for any
	// key or feed, and waiting lookups carry ErrRetryAfterHold. A proxy's maintenance page may ask
	// for a day. Default 60s.
	MaxRetryAfter time.Duration
	// MetricsPrefix begins the names of the cache's metrics on controller-runtime's registry
	// (<prefix>_externalcache_entries, ...): a metric name's first part,
	// [a-zA-Z_:][a-zA-Z0-9_:]*. Caches of one prefix in a process add up. Default
	// DefaultMetricsPrefix (kshard).
	MetricsPrefix string

	// Workers is the number of fetch workers, which bounds concurrent calls to the source.
	// Default 8.
	Workers int
	// QueueSize bounds the fetch queue. Get reports ErrQueueFull beyond it; Warm and Wait wait
	// for room. A replica's start asks for every distinct key its objects read at once (16,000
	// for 100,000 objects over 1,000 domains of 16 keys), and each queued key costs a few hundred
	// bytes of heap until it is fetched. Default 32768.
	QueueSize int
	// RateLimit bounds calls to the source per second (rate.Inf: unlimited). Default 500.
	RateLimit rate.Limit
	// RateBurst is the rate limit's burst. Default 100.
	RateBurst int
	// MaxBatch bounds the keys of one domain a BatchSource reads in one call (the queued keys
	// of a shard's domain go together, each call one token of RateLimit). 1 reads every key
	// alone. Ignored for a Source that is not a BatchSource. Default 64.
	MaxBatch int
	// CallTimeout bounds one call to the source. Default 5s.
	CallTimeout time.Duration
	// Breaker configures the circuit breaker.
	Breaker BreakerOptions
	// Retry configures retries of failed fetches.
	Retry RetryOptions
	// FeedRetry configures the change feed's backoff after errors.
	FeedRetry FeedRetryOptions
	// FeedHealth decides when a domain's change feed is unhealthy, and so when its values are
	// refreshed on their soft TTL instead of when the feed reports a change.
	FeedHealth FeedHealthOptions
	// NotifyQueueSize bounds the keys waiting for OnUpdate (notifications are coalesced per key).
	// Beyond it notifications are dropped, counted in
	// kshard_externalcache_notifications_dropped_total and logged. Default 65536.
	NotifyQueueSize int
}

// BreakerOptions configures the circuit breaker that stops calling a failing source.
type BreakerOptions struct {
	// ConsecutiveFailures opens the breaker. Default 5.
	ConsecutiveFailures uint32
	// Timeout is how long the breaker stays open before letting probes through: the longest a
	// recovered source goes unnoticed (a probe that finds it answering closes the breaker, and
	// every key that failed meanwhile is fetched again at once). Default 5s.
	Timeout time.Duration
	// HalfOpenProbes is how many calls a half-open breaker lets through. Default 1.
	HalfOpenProbes uint32
	// Interval clears the failure counts of a closed breaker periodically. Default 60s.
	Interval time.Duration
}

// RetryOptions configures retries. A fetch is retried with exponential backoff, each wait
// jittered down to no less than half of it, never earlier than the source's Retry-After, at most
// MaxAttempts times and within MaxElapsed; workers are not held while waiting. After that the key
// is failed (waiters released, OnUpdate fired) and retried again after FailureRetryInterval, so
// values come back by themselves when the source recovers.
type RetryOptions struct {
	// MaxAttempts per round of fetching. Default 4.
	MaxAttempts int
	// BaseDelay is the first backoff, jittered down to half of it. Default 200ms.
	BaseDelay time.Duration
	// MaxDelay caps one backoff, jittered down to half of it. Default 5s.
	MaxDelay time.Duration
	// MaxElapsed bounds a round of attempts. Default 20s.
	MaxElapsed time.Duration
	// FailureRetryInterval is when a failed key is tried again (jittered up to 20% later).
	// Default 30s.
	FailureRetryInterval time.Duration
}

// FeedRetryOptions configures how a change-feed loop (FeedLoop) backs off and spaces its polls.
type FeedRetryOptions struct {
	// BaseDelay is the first backoff after an error, jittered down to half of it. Default 1s.
	BaseDelay time.Duration
	// MaxDelay caps the backoff, jittered down to half of it. Default 60s.
	MaxDelay time.Duration
	// MinInterval is the least time between two polls that returned no changes, a guard
	// against a source that answers long polls at once. Default 1s.
	MinInterval time.Duration
}

// FeedHealthOptions decides when a domain's change feed is unhealthy: when it cannot be trusted to
// report every change of the domain. A feed is unhealthy while one of these holds, the first
// that does naming the reason:
//
//   - failing: its polls have failed for FailingFor, with no answer between (errors; a Retry-After
//     hold is no poll). The next answer heals it, as it brings every change since the last one:
//     a shorter failure (a restart of the source) only delays changes, and is not worth saying.
//   - short_polls: its last ShortPolls answers without changes each came back sooner than
//     FeedRetry.MinInterval, so its long polls are not held open (a proxy that does not support
//     them, or answers from its cache) and "nothing changed" means nothing. An answer without
//     changes that was held open heals it; answers with changes count neither way.
//   - epoch_flapping: the source's epoch changed back to one this feed saw before, or changed
//     again before an answer of the new epoch was applied: its answers come from more than one
//     history (several sources behind a load balancer), each missing the others' changes. One
//     change of epoch is a restart, which only resynchronises. It heals once an answer was
//     applied and the epoch has not flapped for EpochStableFor. A flapping feed backs off as
//     after errors (FeedRetry) instead of relisting the domain at every poll.
//
// While a domain's feed is unhealthy, every key of the domain that a held shard reads or fetches
// is refreshed at its soft expiry (a not-found answer at its NegativeTTL), and a change found so
// is notified through OnUpdate as usual; Lookups carry FeedErr; KeyExists does not answer for
// the domain; OnFeedHealth is told; kshard_externalcache_unhealthy_feeds counts the domain by
// reason. When it heals, the timers stop and the feed drives refreshes again.
type FeedHealthOptions struct {
	// FailingFor is how long polls failing in a row make the feed unhealthy. Default 1m.
	FailingFor time.Duration
	// ShortPolls is how many answers without changes in a row, each sooner than
	// FeedRetry.MinInterval, make the feed unhealthy. Default 3.
	ShortPolls int
	// EpochStableFor is how long a feed whose epoch flapped stays unhealthy after the last flap.
	// Default 2m: several long polls without a flap.
	EpochStableFor time.Duration
}

func (o *FeedRetryOptions) setDefaults() {
	setDefault(&o.BaseDelay, time.Second)
	setDefault(&o.MaxDelay, time.Minute)
	setDefault(&o.MinInterval, time.Second)
}

func (o *FeedHealthOptions) setDefaults() {
	setDefault(&o.FailingFor, time.Minute)
	setDefault(&o.ShortPolls, 3)
	setDefault(&o.EpochStableFor, 2*time.Minute)
}

func (o *Options) setDefaults() {
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	if o.MetricsPrefix == "" {
		o.MetricsPrefix = DefaultMetricsPrefix
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	setDefault(&o.MaxBytes, 256*mib)
	setDefault(&o.MaxShards, 64)
	setDefault(&o.MaxEntryBytes, 64<<10)
	setDefault(&o.InternalShards, 16)
	setDefault(&o.ExpectedEntries, 160)
	setDefault(&o.ExpectedEntryBytes, 512)
	setDefault(&o.CleanWindow, time.Minute)
	setDefault(&o.HardTTL, time.Hour)
	setDefault(&o.SoftTTL, min(5*time.Minute, o.HardTTL/2))
	setDefault(&o.TTLJitter, 0.1)
	setDefault(&o.NegativeTTL, 30*time.Second)
	setDefault(&o.MaxRetryAfter, time.Minute)
	setDefault(&o.Workers, 8)
	setDefault(&o.QueueSize, 32768)
	setDefault(&o.RateLimit, 500)
	setDefault(&o.RateBurst, 100)
	setDefault(&o.MaxBatch, 64)
	setDefault(&o.CallTimeout, 5*time.Second)
	setDefault(&o.Breaker.ConsecutiveFailures, 5)
	setDefault(&o.Breaker.Timeout, 5*time.Second)
	setDefault(&o.Breaker.HalfOpenProbes, 1)
	setDefault(&o.Breaker.Interval, time.Minute)
	setDefault(&o.Retry.MaxAttempts, 4)
	setDefault(&o.Retry.BaseDelay, 200*time.Millisecond)
	setDefault(&o.Retry.MaxDelay, 5*time.Second)
	setDefault(&o.Retry.MaxElapsed, 20*time.Second)
	setDefault(&o.Retry.FailureRetryInterval, 30*time.Second)
	o.FeedRetry.setDefaults()
	o.FeedHealth.setDefaults()
	setDefault(&o.NotifyQueueSize, 65536)
}

func setDefault[T int | int64 | uint32 | float64 | time.Duration | rate.Limit](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// maxWrappedEntry is the most bytes bigcache needs for one entry: our envelope with the largest
// value and key (with its tenure prefix), bigcache's own header (timestamp, hash, key length) and
// its queue's length prefix.
func maxWrappedEntry(maxEntryBytes int) int {
	return maxEntryBytes + envelopeHeaderSize + tenurePrefixLen + maxKeyBytes + 1 + 18 + 5
}

// validate checks what defaults cannot fix. It is why an oversized MaxEntryBytes fails at New with
// a message saying what to change, instead of every large value failing later.
func (o *Options) validate() error {
	var errs []error
	if o.Source == nil {
		errs = append(errs, errors.New("a Source is required"))
	}
	if !metricsPrefix.MatchString(o.MetricsPrefix) {
		errs = append(errs, fmt.Errorf("metrics prefix %q must match %s", o.MetricsPrefix, metricsPrefix))
	}
	if o.InternalShards&(o.InternalShards-1) != 0 {
		errs = append(errs, fmt.Errorf("InternalShards %d must be a power of two", o.InternalShards))
	}
	if o.TTLJitter >= 1 {
		errs = append(errs, fmt.Errorf("TTLJitter %v must be below 1", o.TTLJitter))
	}
	if o.HardTTL < o.SoftTTL || o.HardTTL < o.NegativeTTL {
		errs = append(errs, fmt.Errorf("HardTTL %s must be at least SoftTTL %s and NegativeTTL %s", o.HardTTL, o.SoftTTL, o.NegativeTTL))
	}
	if o.MaxBytes < mib {
		errs = append(errs, fmt.Errorf("MaxBytes %d is less than 1 MiB", o.MaxBytes))
	} else if per := o.internalShardBytes(); int64(maxWrappedEntry(o.MaxEntryBytes)) > per/2 {
		errs = append(errs, fmt.Errorf("MaxEntryBytes %d does not fit: the cache holds %d MiB split over %d internal shards of %d bytes, "+
			"and an entry (value plus up to %d bytes of overhead) may use at most half of one; raise MaxBytes or lower InternalShards or MaxEntryBytes",
			o.MaxEntryBytes, o.MaxBytes/mib, o.InternalShards, per, maxWrappedEntry(0)))
	}
	return errors.Join(errs...)
}

// internalShardBytes is what one bigcache internal shard holds before it evicts its oldest entry.
func (o *Options) internalShardBytes() int64 {
	return o.MaxBytes / mib * mib / int64(o.InternalShards)
}

// bigcacheConfig is the configuration of the store: our own envelope expiry decides freshness,
// so bigcache's LifeWindow is only an upper bound set past the hard TTL; stats are off (they take
// a write lock on every hit); the initial allocation is small and grows to the bound; evicted
// reports the entries evicted for room.
func (o *Options) bigcacheConfig(evicted func(key string, entry []byte, reason bigcache.RemoveReason)) bigcache.Config {
	return bigcache.Config{
		Shards:             o.InternalShards,
		LifeWindow:         o.HardTTL + 2*time.Second,
		CleanWindow:        o.CleanWindow,
		MaxEntriesInWindow: o.ExpectedEntries,
		MaxEntrySize:       o.ExpectedEntryBytes,
		StatsEnabled:       false,
		Verbose:            false,
		HardMaxCacheSize:   int(o.MaxBytes / mib),
		OnRemoveWithReason: evicted,
	}.OnRemoveFilterSet(bigcache.NoSpace)
}
