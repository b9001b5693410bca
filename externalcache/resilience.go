package externalcache

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"

	"github.com/kshard/kshard/internal/backoff"
)

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
func newBreaker(o BreakerOptions, stopping func() context.Context, log logr.Logger, halfOpens *atomic.Int64) *gobreaker.CircuitBreaker[Value] {
	return gobreaker.NewCircuitBreaker[Value](gobreaker.Settings{
		Name:        "externalcache",
		MaxRequests: o.HalfOpenProbes,
		Interval:    o.Interval,
		Timeout:     o.Timeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= o.ConsecutiveFailures },
		IsSuccessful: func(err error) bool {
			switch classify(stopping(), err) {
			case classOK, classNotFound, classPermanent:
				return true
			}
			return false
		},
		IsExcluded: func(err error) bool { return classify(stopping(), err) == classCanceled },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			if to == gobreaker.StateHalfOpen {
				halfOpens.Add(1)
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
