package externalcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"

	"github.com/kshard/kshard/internal/backoff"
)

// guard is the one way to the Source: every call for a key, the cache's fetches and Fetch's
// alike, goes through the source's Retry-After hold, a single flight per key, the rate limit, a
// per-call timeout and the circuit breaker, so that no reader of the service gets around what
// protects it. It also sorts the outcomes (classify) for the retries and the breaker.
type guard struct {
	source        Source
	callTimeout   time.Duration
	maxRetryAfter time.Duration
	metrics       *cacheMetrics
	// ctx is the cache's lifetime: calls run on it rather than a caller's, because a call's
	// result is shared by every shard waiting for the key; and its end tells our cancellations
	// (shutdown) from the source timing out.
	ctx context.Context

	group   singleflight.Group
	limiter *rate.Limiter
	breaker *gobreaker.CircuitBreaker[Value]
	// halfOpens counts the breaker's transitions to half-open, each of which lets
	// HalfOpenProbes calls through.
	halfOpens atomic.Int64
	// hold is the source's Retry-After: no call is made while it lasts, feed polls included.
	hold hold
	// recovered is signalled when a probe closed the breaker: the source answers again, and
	// what failed while it did not can be fetched now rather than at its retry time.
	recovered chan struct{}
}

func newGuard(ctx context.Context, opts Options, metrics *cacheMetrics, log logr.Logger) *guard {
	g := &guard{source: opts.Source, callTimeout: opts.CallTimeout, maxRetryAfter: opts.MaxRetryAfter, metrics: metrics, ctx: ctx,
		limiter: rate.NewLimiter(opts.RateLimit, opts.RateBurst), recovered: make(chan struct{}, 1)}
	g.breaker = newBreaker(opts.Breaker, ctx, log, &g.halfOpens, func() {
		select {
		case g.recovered <- struct{}{}:
		default: // one signal pending is enough
		}
	})
	return g
}

// shared is the outcome of one guarded call for key, shared with every other caller asking for
// the key meanwhile (single flight).
func (g *guard) shared(key Key) <-chan singleflight.Result {
	return g.group.DoChan(key.cacheKey(), func() (any, error) { return g.call(key) })
}

// call makes one protected call: rate limit, timeout, circuit breaker.
func (g *guard) call(key Key) (Value, error) {
	if err := g.limiter.Wait(g.ctx); err != nil {
		return Value{}, fmt.Errorf("waiting for the rate limit: %w", err)
	}
	ctx, cancel := context.WithTimeout(g.ctx, g.callTimeout)
	defer cancel()
	v, err := g.breaker.Execute(func() (Value, error) {
		start := time.Now()
		v, err := g.source.Fetch(ctx, key)
		g.metrics.callDuration.Observe(time.Since(start).Seconds())
		g.metrics.calls.WithLabelValues(callCode(err, g.classify(err))).Inc()
		return v, err
	})
	if g.classify(err) == classCircuitOpen {
		err = circuitOpen(err)
	}
	return v, err
}

// callBatch makes one protected call for several keys of a domain (BatchSource.FetchBatch): one
// token of the rate limit, one timeout and one outcome for the circuit breaker, as one call is.
// It is not shared with other callers: the keys' flights are this shard's.
func (g *guard) callBatch(source BatchSource, domain string, names []string) ([]Fetched, error) {
	if err := g.limiter.Wait(g.ctx); err != nil {
		return nil, fmt.Errorf("waiting for the rate limit: %w", err)
	}
	ctx, cancel := context.WithTimeout(g.ctx, g.callTimeout)
	defer cancel()
	var values []Fetched
	_, err := g.breaker.Execute(func() (Value, error) {
		start := time.Now()
		var err error
		values, err = source.FetchBatch(ctx, domain, names)
		if err == nil && len(values) != len(names) {
			err = fmt.Errorf("%w: %d answers to a batch of %d keys of domain %s", ErrInvalidValue, len(values), len(names), domain)
		}
		g.metrics.callDuration.Observe(time.Since(start).Seconds())
		g.metrics.calls.WithLabelValues(callCode(err, g.classify(err))).Inc()
		return Value{}, err
	})
	if g.classify(err) == classCircuitOpen {
		err = circuitOpen(err)
	}
	return values, err
}

// fetch is Cache.Fetch: one guarded call for a reader that caches nothing, which waits no longer
// than ctx. A Retry-After it is answered with holds every later call.
func (g *guard) fetch(ctx context.Context, key Key) (Value, error) {
	if err := g.hold.err(); err != nil {
		return Value{}, fmt.Errorf("fetching %s: %w", key, err)
	}
	select {
	case r := <-g.shared(key):
		if r.Err != nil {
			if hint := g.retryAfter(r.Err); hint > 0 && g.classify(r.Err) == classRetryable {
				g.hold.extend(hint)
			}
			return Value{}, fmt.Errorf("fetching %s: %w", key, r.Err)
		}
		v, _ := r.Val.(Value)
		// The value is shared with the other callers of the flight.
		v.Data = bytes.Clone(v.Data)
		return v, nil
	case <-ctx.Done():
		return Value{}, fmt.Errorf("fetching %s: %w", key, ctx.Err())
	}
}

// classify sorts an outcome of the source by the cache's lifetime.
func (g *guard) classify(err error) failureClass { return classify(g.ctx, err) }

// retryAfter is the wait the source asked for with err, capped at MaxRetryAfter (and counted when
// capped).
func (g *guard) retryAfter(err error) time.Duration {
	return retryAfterHint(err, g.maxRetryAfter, g.metrics.retryAfterCapped)
}

// failureClass is what a fetch outcome means for caching, retrying and the circuit breaker.
type failureClass int

const (
	// classOK: a value; cache it.
	classOK failureClass = iota
	// classNotFound: the key does not exist; cache that. A success for the breaker.
	classNotFound
	// classPermanent: the request itself is wrong (4xx) or the value cannot be cached; retrying
	// will not help and the service is healthy, so it is a success for the breaker.
	classPermanent
	// classRetryable: transport errors, timeouts, 5xx and 429; retried, a failure for the breaker.
	classRetryable
	// classCircuitOpen: the breaker rejected the call without making it.
	classCircuitOpen
	// classCanceled: the cache is stopping; neither success nor failure.
	classCanceled
)

// classify sorts a fetch outcome. stopping is the cache's own context, which tells our
// cancellations (shutdown) from the source timing out.
func classify(stopping context.Context, err error) failureClass {
	switch {
	case err == nil:
		return classOK
	case errors.Is(err, ErrNotFound):
		return classNotFound
	case errors.Is(err, ErrEntryTooLarge), errors.Is(err, ErrInvalidValue), errors.Is(err, ErrRejected):
		return classPermanent
	case errors.Is(err, gobreaker.ErrOpenState), errors.Is(err, gobreaker.ErrTooManyRequests), errors.Is(err, ErrCircuitOpen):
		return classCircuitOpen
	case stopping.Err() != nil && errors.Is(err, context.Canceled):
		return classCanceled
	}
	if code, ok := statusCode(err); ok {
		if code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500 {
			return classRetryable
		}
		if code >= 400 {
			return classPermanent
		}
	}
	return classRetryable
}

func statusCode(err error) (int, bool) {
	var sc StatusCoder
	if errors.As(err, &sc) {
		return sc.StatusCode(), true
	}
	return 0, false
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// retryAfterHint is the wait the source asked for, if any, capped at most: a proxy's
// maintenance page saying "Retry-After: 86400" must not stop every fetch and feed for a day.
// capped, unless nil, counts the answers capped so.
func retryAfterHint(err error, most time.Duration, capped prometheus.Counter) time.Duration {
	var h RetryAfterHinter
	if errors.As(err, &h) {
		d := max(0, h.RetryAfterHint())
		if d > most {
			if capped != nil {
				capped.Inc()
			}
			d = most
		}
		return d
	}
	return 0
}

// retryPolicy is the backoff of the cache's retries and of change-feed loops: from base,
// doubling, up to maxDelay, with "equal jitter" (each wait uniform in [d/2, d)). The jitter
// spreads the retries of keys or feeds that failed together; its floor of half the delay keeps a
// loop from spinning when every call fails at once, which full jitter near zero would allow.
// The policy jitters upwards, so it starts and caps at half the delays, lengthened by up to all
// of them.
func retryPolicy(base, maxDelay time.Duration) backoff.Policy {
	return backoff.Policy{Initial: base / 2, Max: maxDelay / 2, Jitter: 1}
}

// retryDelay is d's next wait, but never sooner than the Retry-After err carries (capped at
// most): the source asked every caller to wait that long.
func retryDelay(d *backoff.Delays, err error, most time.Duration) time.Duration {
	return max(d.Next(), retryAfterHint(err, most, nil))
}

// newBreaker builds the circuit breaker. NotFound and permanent errors count as successes (the
// service answered), retryable ones as failures, and the cache's own shutdown as neither.
// recovered is called when a half-open probe closes it, under the breaker's lock: it must not
// call the breaker.
func newBreaker(o BreakerOptions, stopping context.Context, log logr.Logger, halfOpens *atomic.Int64, recovered func()) *gobreaker.CircuitBreaker[Value] {
	return gobreaker.NewCircuitBreaker[Value](gobreaker.Settings{
		Name:        "externalcache",
		MaxRequests: o.HalfOpenProbes,
		Interval:    o.Interval,
		Timeout:     o.Timeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= o.ConsecutiveFailures },
		IsSuccessful: func(err error) bool {
			switch classify(stopping, err) {
			case classOK, classNotFound, classPermanent:
				return true
			}
			return false
		},
		IsExcluded: func(err error) bool { return classify(stopping, err) == classCanceled },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if to == gobreaker.StateHalfOpen {
				halfOpens.Add(1)
			}
			if from == gobreaker.StateHalfOpen && to == gobreaker.StateClosed {
				recovered()
			}
			log.Info("Circuit breaker changed state", "from", from.String(), "to", to.String())
		},
	})
}

// hold is a time before which no call is made to the source, set from a Retry-After: a service
// that says "wait" is saying it for every key, not just the one that was throttled.
type hold struct {
	until atomic.Int64 // Unix nanoseconds
}

func (h *hold) extend(d time.Duration) {
	t := time.Now().Add(d).UnixNano()
	for {
		cur := h.until.Load()
		if cur >= t {
			return
		}
		if h.until.CompareAndSwap(cur, t) {
			return
		}
	}
}

func (h *hold) remaining() time.Duration {
	return time.Until(time.Unix(0, h.until.Load()))
}

// err says, while the hold lasts, until when, for the lookups and fetches that wait on it.
func (h *hold) err() error {
	until := time.Unix(0, h.until.Load())
	if !time.Now().Before(until) {
		return nil
	}
	return holdError{until: until}
}

// holdError is the error of a call the Retry-After hold stopped. It carries the wait left as a
// RetryAfterHint, so that a caller that retries (a FeedLoop) waits the hold out rather than
// backing off by its own count.
type holdError struct{ until time.Time }

func (e holdError) Error() string {
	return fmt.Sprintf("%v: no call until %s", ErrRetryAfterHold, e.until.UTC().Format(time.RFC3339))
}

func (e holdError) Unwrap() error { return ErrRetryAfterHold }

// RetryAfterHint is the wait left.
func (e holdError) RetryAfterHint() time.Duration { return time.Until(e.until) }

// circuitOpen wraps a breaker rejection so callers can test errors.Is(err, ErrCircuitOpen).
func circuitOpen(err error) error {
	return fmt.Errorf("%w: %w", ErrCircuitOpen, err)
}
