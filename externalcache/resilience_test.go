package externalcache

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
)

type nopSource struct{}

func (nopSource) Fetch(context.Context, Key) (Value, error) { return Value{}, ErrNotFound }

type statusErr struct {
	code int
	ra   time.Duration
}

func (e statusErr) Error() string                 { return fmt.Sprintf("status %d", e.code) }
func (e statusErr) StatusCode() int               { return e.code }
func (e statusErr) RetryAfterHint() time.Duration { return e.ra }

func TestClassifyDecidesRetryAndBreaker(t *testing.T) {
	live := context.Background()
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		ctx  context.Context
		err  error
		want failureClass
	}{
		{"success", live, nil, classOK},
		{"not found", live, fmt.Errorf("x: %w", ErrNotFound), classNotFound},
		{"bad request", live, statusErr{code: 400}, classPermanent},
		{"forbidden", live, fmt.Errorf("wrapped: %w", statusErr{code: 403}), classPermanent},
		{"too large", live, fmt.Errorf("%w: big", ErrEntryTooLarge), classPermanent},
		{"throttled", live, statusErr{code: 429}, classRetryable},
		{"request timeout", live, statusErr{code: 408}, classRetryable},
		{"server error", live, statusErr{code: 503}, classRetryable},
		{"transport", live, errors.New("connection refused"), classRetryable},
		{"call timeout", live, context.DeadlineExceeded, classRetryable},
		{"breaker open", live, gobreaker.ErrOpenState, classCircuitOpen},
		{"half-open full", live, circuitOpen(gobreaker.ErrTooManyRequests), classCircuitOpen},
		{"our shutdown", stopped, context.Canceled, classCanceled},
		// One key's unreadable answer fails that key; the breaker counts it as the service answering.
		{"invalid value", live, fmt.Errorf("%w: garbage", ErrInvalidValue), classPermanent},
		{"someone else's cancel", live, context.Canceled, classRetryable},
	}
	for _, tc := range cases {
		if got := classify(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: classify = %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := retryAfterHint(fmt.Errorf("w: %w", statusErr{code: 429, ra: 3 * time.Second}), time.Minute); got != 3*time.Second {
		t.Errorf("retryAfterHint = %s, want 3s", got)
	}
	// A maintenance page's day is honoured only up to the cap.
	if got := retryAfterHint(statusErr{code: 503, ra: 24 * time.Hour}, time.Minute); got != time.Minute {
		t.Errorf("retryAfterHint of a day, capped at a minute = %s", got)
	}
	if got := callCode(statusErr{code: 503}, classRetryable); got != "503" {
		t.Errorf("callCode(503) = %q", got)
	}
	if got := callCode(context.DeadlineExceeded, classRetryable); got != "timeout" {
		t.Errorf("callCode(deadline) = %q", got)
	}
}

func TestBackoffStaysWithinItsCap(t *testing.T) {
	for attempt := range 70 {
		for range 50 {
			d := backoff(100*time.Millisecond, 2*time.Second, attempt)
			if d < 0 || d >= 2*time.Second || d >= 100*time.Millisecond<<min(attempt, 20) {
				t.Fatalf("backoff(attempt %d) = %s, outside [0, min(2s, 100ms·2^n))", attempt, d)
			}
			f := feedBackoff(time.Second, 8*time.Second, attempt)
			if limit := min(8*time.Second, time.Second<<min(attempt, 20)); f < limit/2 || f > limit {
				t.Fatalf("feedBackoff(attempt %d) = %s, outside [%s, %s]", attempt, f, limit/2, limit)
			}
		}
	}
}

func TestHoldOnlyExtends(t *testing.T) {
	var h hold
	if h.remaining() > 0 {
		t.Fatal("a new hold is active")
	}
	h.extend(time.Hour)
	h.extend(time.Second)
	if h.remaining() < 59*time.Minute {
		t.Errorf("a shorter Retry-After shortened the hold to %s", h.remaining())
	}
}
