package externalcache

import (
	"errors"
	"fmt"
	"time"

	"github.com/allegro/bigcache/v3"
	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
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
	// Log receives the cache's logs. Default: discard.
	Log logr.Logger
	// Now is the clock for TTLs. Default time.Now. Tests inject a clock to expire entries
	// without waiting; timers for retries and the breaker always use real time.
	Now func() time.Time

	// MaxBytes bounds the bytes of all entries across all shards. Default 256 MiB.
	//
	// The budget is split evenly: each held shard gets MaxBytes/MaxShards (whole MiB, at least 1),
	// one bigcache per shard. A global budget shared by all shards would use memory better when a
	// replica holds few shards, but dropping a shard would then mean scanning one big cache; with a
	// fixed share per shard, dropping is O(1) and the bound holds whatever the number of held
	// shards, because at most MaxShards are held.
	MaxBytes int64
	// MaxShards is the most shards held at once; AddShard of one more reports ErrTooManyShards.
	// Default 64, kshard's default shard count, so a single replica may hold every shard.
	MaxShards int
	// MaxEntryBytes bounds one value. Larger values are refused with ErrEntryTooLarge. It must
	// fit in half of one bigcache internal shard (MaxBytes/MaxShards/InternalShards), which New
	// checks. Default 64 KiB.
	MaxEntryBytes int
	// InternalShards is the number of bigcache shards (lock stripes) per kshard shard, a power of
	// two. Default 4: kshard shards already stripe the locks, and each internal shard costs an
	// initial allocation (ExpectedEntryBytes times at least 10 entries): 16 of them in 64 shards
	// were 5 MiB of an empty replica's heap.
	InternalShards int
	// ExpectedEntriesPerShard and ExpectedEntryBytes size bigcache's initial allocation; it
	// doubles on demand up to the byte bound. Defaults 40 and 512: bigcache's floor of 10 entries
	// per internal shard, so an empty shard costs about 20 KiB and a replica holding all 64 shards
	// 1.3 MiB before any value arrives, by bigcache's sizing (entries × entry bytes). The first
	// defaults, 1024 entries in 16 internal shards, sized 512 KiB per shard, 32 MiB for 64, for
	// the two dozen keys a shard of the load tests holds.
	ExpectedEntriesPerShard int
	ExpectedEntryBytes      int
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

	// Workers is the number of fetch workers, which bounds concurrent calls to the source.
	// Default 8.
	Workers int
	// QueueSize bounds the fetch queue. Get reports ErrQueueFull beyond it; Warm and Wait wait
	// for room. Default 4096.
	QueueSize int
	// RateLimit bounds calls to the source per second (rate.Inf: unlimited). Default 500.
	RateLimit rate.Limit
	// RateBurst is the rate limit's burst. Default 100.
	RateBurst int
	// CallTimeout bounds one call to the source. Default 5s.
	CallTimeout time.Duration
	// Breaker configures the circuit breaker.
	Breaker BreakerOptions
	// Retry configures retries of failed fetches.
	Retry RetryOptions
	// FeedRetry configures the change feed's backoff after errors.
	FeedRetry FeedRetryOptions
	// NotifyQueueSize bounds the keys waiting for OnUpdate (notifications are coalesced per key).
	// Beyond it notifications are dropped, counted in
	// kshard_externalcache_notifications_dropped_total and logged. Default 65536.
	NotifyQueueSize int
}

// BreakerOptions configures the circuit breaker that stops calling a failing source.
type BreakerOptions struct {
	// ConsecutiveFailures opens the breaker. Default 5.
	ConsecutiveFailures uint32
	// Timeout is how long the breaker stays open before letting probes through. Default 30s.
	Timeout time.Duration
	// HalfOpenProbes is how many calls a half-open breaker lets through. Default 1.
	HalfOpenProbes uint32
	// Interval clears the failure counts of a closed breaker periodically. Default 60s.
	Interval time.Duration
}

// RetryOptions configures retries. A fetch is retried with exponential backoff and full jitter,
// never earlier than the source's Retry-After, at most MaxAttempts times and within MaxElapsed;
// workers are not held while waiting. After that the key is failed (waiters released, OnUpdate
// fired) and retried again after FailureRetryInterval, so values come back by themselves when the
// source recovers.
type RetryOptions struct {
	// MaxAttempts per round of fetching. Default 4.
	MaxAttempts int
	// BaseDelay is the first backoff. Default 200ms.
	BaseDelay time.Duration
	// MaxDelay caps one backoff. Default 5s.
	MaxDelay time.Duration
	// MaxElapsed bounds a round of attempts. Default 20s.
	MaxElapsed time.Duration
	// FailureRetryInterval is when a failed key is tried again (±20% jitter). Default 30s.
	FailureRetryInterval time.Duration
}

// FeedRetryOptions configures how a change-feed loop backs off.
type FeedRetryOptions struct {
	// BaseDelay is the first backoff after an error. Default 1s.
	BaseDelay time.Duration
	// MaxDelay caps the backoff. Default 60s.
	MaxDelay time.Duration
	// MinInterval is the least time between two polls that returned no changes, a guard
	// against a source that answers long polls at once. Default 1s.
	MinInterval time.Duration
}

func (o *Options) setDefaults() {
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	setDefault(&o.MaxBytes, 256*mib)
	setDefault(&o.MaxShards, 64)
	setDefault(&o.MaxEntryBytes, 64<<10)
	setDefault(&o.InternalShards, 4)
	setDefault(&o.ExpectedEntriesPerShard, 40)
	setDefault(&o.ExpectedEntryBytes, 512)
	setDefault(&o.CleanWindow, time.Minute)
	setDefault(&o.HardTTL, time.Hour)
	setDefault(&o.SoftTTL, min(5*time.Minute, o.HardTTL/2))
	setDefault(&o.TTLJitter, 0.1)
	setDefault(&o.NegativeTTL, 30*time.Second)
	setDefault(&o.MaxRetryAfter, time.Minute)
	setDefault(&o.Workers, 8)
	setDefault(&o.QueueSize, 4096)
	setDefault(&o.RateLimit, 500)
	setDefault(&o.RateBurst, 100)
	setDefault(&o.CallTimeout, 5*time.Second)
	setDefault(&o.Breaker.ConsecutiveFailures, 5)
	setDefault(&o.Breaker.Timeout, 30*time.Second)
	setDefault(&o.Breaker.HalfOpenProbes, 1)
	setDefault(&o.Breaker.Interval, time.Minute)
	setDefault(&o.Retry.MaxAttempts, 4)
	setDefault(&o.Retry.BaseDelay, 200*time.Millisecond)
	setDefault(&o.Retry.MaxDelay, 5*time.Second)
	setDefault(&o.Retry.MaxElapsed, 20*time.Second)
	setDefault(&o.Retry.FailureRetryInterval, 30*time.Second)
	setDefault(&o.FeedRetry.BaseDelay, time.Second)
	setDefault(&o.FeedRetry.MaxDelay, time.Minute)
	setDefault(&o.FeedRetry.MinInterval, time.Second)
	setDefault(&o.NotifyQueueSize, 65536)
}

func setDefault[T int | int64 | uint32 | float64 | time.Duration | rate.Limit](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// maxWrappedEntry is the most bytes bigcache needs for one entry: our envelope with the largest
// value and key, bigcache's own header (timestamp, hash, key length) and its queue's length prefix.
func maxWrappedEntry(maxEntryBytes int) int {
	return maxEntryBytes + envelopeHeaderSize + maxKeyBytes + 1 + 18 + 5
}

// validate checks what defaults cannot fix. It is why an oversized MaxEntryBytes fails at New with
// a message saying what to change, instead of every large value failing later.
func (o *Options) validate() error {
	var errs []error
	if o.Source == nil {
		errs = append(errs, errors.New("a Source is required"))
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
	shardMiB := o.MaxBytes / int64(o.MaxShards) / mib
	if shardMiB < 1 {
		errs = append(errs, fmt.Errorf("MaxBytes %d over MaxShards %d leaves less than 1 MiB per shard", o.MaxBytes, o.MaxShards))
	} else if per := shardMiB * mib / int64(o.InternalShards); int64(maxWrappedEntry(o.MaxEntryBytes)) > per/2 {
		errs = append(errs, fmt.Errorf("MaxEntryBytes %d does not fit: each shard holds %d MiB split over %d internal shards of %d bytes, "+
			"and an entry (value plus up to %d bytes of overhead) may use at most half of one; raise MaxBytes or lower MaxShards, InternalShards or MaxEntryBytes",
			o.MaxEntryBytes, shardMiB, o.InternalShards, per, maxWrappedEntry(0)))
	}
	return errors.Join(errs...)
}

// bigcacheConfig is the configuration of one shard's bigcache: our own envelope expiry decides
// freshness, so bigcache's LifeWindow is only an upper bound set past the hard TTL; stats are off
// (they take a write lock on every hit); the initial allocation is small and grows to the bound.
func (o *Options) bigcacheConfig() bigcache.Config {
	return bigcache.Config{
		Shards:             o.InternalShards,
		LifeWindow:         o.HardTTL + 2*time.Second,
		CleanWindow:        o.CleanWindow,
		MaxEntriesInWindow: o.ExpectedEntriesPerShard,
		MaxEntrySize:       o.ExpectedEntryBytes,
		StatsEnabled:       false,
		Verbose:            false,
		HardMaxCacheSize:   int(o.MaxBytes / int64(o.MaxShards) / mib),
	}
}

// shardBytes is the byte bound of one held shard under these options.
func (o Options) shardBytes() int64 {
	return o.MaxBytes / int64(o.MaxShards) / mib * mib
}
