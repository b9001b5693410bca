package externalcache

import (
	"context"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
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
		{"rejected by the service (any protocol)", live, fmt.Errorf("reading x: %w: wrong password", ErrRejected), classPermanent},
		{"someone else's cancel", live, context.Canceled, classRetryable},
	}
	for _, tc := range cases {
		if got := classify(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: classify = %d, want %d", tc.name, got, tc.want)
		}
	}
	capped := prometheus.NewCounter(prometheus.CounterOpts{Name: "capped"})
	if got := retryAfterHint(fmt.Errorf("w: %w", statusErr{code: 429, ra: 3 * time.Second}), time.Minute, capped); got != 3*time.Second {
		t.Errorf("retryAfterHint = %s, want 3s", got)
	}
	// A maintenance page's day is honoured only up to the cap, and counted.
	if got := retryAfterHint(statusErr{code: 503, ra: 24 * time.Hour}, time.Minute, capped); got != time.Minute {
		t.Errorf("retryAfterHint of a day, capped at a minute = %s", got)
	}
	if n := testutil.ToFloat64(capped); n != 1 {
		t.Errorf("%v answers counted as capped, want 1", n)
	}
	if got := callCode(statusErr{code: 503}, classRetryable); got != "503" {
		t.Errorf("callCode(503) = %q", got)
	}
	if got := callCode(context.DeadlineExceeded, classRetryable); got != "timeout" {
		t.Errorf("callCode(deadline) = %q", got)
	}
}

// TestBackoffStaysWithinItsCap: the retries' and feed loops' backoff doubles from its base up to
// its cap, each step jittered down to no less than half of it, so that a loop cannot spin.
func TestBackoffStaysWithinItsCap(t *testing.T) {
	for range 50 {
		b := retryPolicy(100*time.Millisecond, 2*time.Second).Delays()
		for n := range 70 {
			d := b.Next()
			if limit := min(2*time.Second, 100*time.Millisecond<<min(n, 20)); d < limit/2 || d >= limit {
				t.Fatalf("step %d = %s, outside [%s, %s)", n, d, limit/2, limit)
			}
		}
	}
}

// TestRetryDelayCapsRetryAfter: a Retry-After is honoured up to its cap (a proxy's
// "Retry-After: 86400" held a mirror's sync for a day), and a shorter one still delays the next
// call past the backoff.
func TestRetryDelayCapsRetryAfter(t *testing.T) {
	b := retryPolicy(500*time.Millisecond, 30*time.Second).Delays()
	if d := retryDelay(&b, fmt.Errorf("polling: %w", statusErr{code: 503, ra: 24 * time.Hour}), time.Minute); d != time.Minute {
		t.Errorf("Retry-After 24h: next call in %s, want the cap of 1m", d)
	}
	if d := retryDelay(&b, statusErr{code: 503, ra: 10 * time.Second}, time.Minute); d != 10*time.Second {
		t.Errorf("Retry-After 10s: next call in %s, want 10s", d)
	}
	b = retryPolicy(500*time.Millisecond, 30*time.Second).Delays()
	if d := retryDelay(&b, errors.New("connection refused"), time.Minute); d > 500*time.Millisecond {
		t.Errorf("first failure without Retry-After: next call in %s, want at most the base 500ms", d)
	}
}

// TestLostHistory: which change-feed answers mean that the source lost the history the loop's
// revision belongs to.
func TestLostHistory(t *testing.T) {
	for _, tc := range []struct {
		name  string
		since int64
		epoch string
		cs    ChangeSet
		lost  bool
	}{
		{"first poll", 0, "", ChangeSet{Revision: 7, Epoch: "e1"}, false},
		{"same epoch, on", 7, "e1", ChangeSet{Revision: 9, Epoch: "e1"}, false},
		{"revision went back", 7, "e1", ChangeSet{Revision: 3, Epoch: "e1"}, true},
		{"another epoch, revision on", 7, "e1", ChangeSet{Revision: 900, Epoch: "e2"}, true},
		{"a source without epochs", 7, "", ChangeSet{Revision: 9}, false},
		{"a mirror written before epochs were recorded", 7, "", ChangeSet{Revision: 9, Epoch: "e1"}, true},
	} {
		if got := lostHistory(tc.since, tc.epoch, tc.cs); got != tc.lost {
			t.Errorf("%s: lostHistory = %v, want %v", tc.name, got, tc.lost)
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
