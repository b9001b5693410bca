package standin

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/kshard/kshard/internal/configcenter"
)

// injector applies the current Faults to data requests.
type injector struct {
	mu      sync.Mutex
	faults  configcenter.Faults
	limiter *rate.Limiter
	// polls counts each domain's change-feed polls while AlternateEpochs is on.
	polls map[string]uint64
}

// secondHistory reports whether this poll of domain is answered by the other history of
// AlternateEpochs: every other poll of each domain, so that one client's poller sees the
// epochs alternate whoever else polls.
func (in *injector) secondHistory(domain string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.polls == nil {
		in.polls = map[string]uint64{}
	}
	in.polls[domain]++
	return in.polls[domain]%2 == 0
}

func (in *injector) set(f configcenter.Faults) error {
	if err := f.Validate(); err != nil {
		return fmt.Errorf("setting faults: %w", err)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.faults = f
	in.limiter = nil
	in.polls = nil
	if f.RateLimit > 0 {
		burst := f.RateBurst
		if burst == 0 {
			burst = max(1, int(f.RateLimit))
		}
		in.limiter = rate.NewLimiter(rate.Limit(f.RateLimit), burst)
	}
	return nil
}

func (in *injector) get() configcenter.Faults {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.faults
}

// rejection is a fault that answers a request instead of the handler.
type rejection struct {
	code       int
	retryAfter time.Duration
	message    string
}

// apply runs the faults for one request, in the order a real overloaded service shows them:
// outage and throttling answer at once, then latency, then random errors. It returns nil when the
// request may proceed to its handler.
func (in *injector) apply(ctx context.Context) *rejection {
	in.mu.Lock()
	f := in.faults
	var throttled time.Duration
	if in.limiter != nil && !f.Outage {
		now := time.Now()
		r := in.limiter.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			throttled = d
		}
	}
	in.mu.Unlock()

	if f.Outage {
		return &rejection{code: http.StatusServiceUnavailable, retryAfter: f.RetryAfter.Duration, message: "injected outage"}
	}
	if throttled > 0 {
		ra := f.RetryAfter.Duration
		if ra == 0 {
			ra = time.Duration(math.Ceil(throttled.Seconds())) * time.Second
		}
		return &rejection{code: http.StatusTooManyRequests, retryAfter: ra, message: "injected rate limit"}
	}
	if d := f.Latency.Duration + jitter(f.Jitter.Duration); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return &rejection{code: http.StatusServiceUnavailable, message: "request abandoned during injected latency"}
		}
	}
	if f.ErrorRate > 0 && rand.Float64() < f.ErrorRate {
		return &rejection{code: http.StatusInternalServerError, message: "injected error"}
	}
	return nil
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d)
}

// retryAfterSeconds renders d as a Retry-After value: whole seconds, rounded up, at least 1, so
// that a client honouring it never comes back earlier than the server meant.
func retryAfterSeconds(d time.Duration) string {
	return fmt.Sprint(max(1, int64(math.Ceil(d.Seconds()))))
}
