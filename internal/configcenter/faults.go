package configcenter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxInjectedLatency bounds the latency a fault may add, so that a typo cannot hang clients for
// hours.
const maxInjectedLatency = 5 * time.Minute

// Faults are the failures the server injects into data routes (keys and changes), never into
// /admin, /metrics or /healthz, so that a test can always observe and undo them.
type Faults struct {
	// Latency is added to every data request before it is answered.
	Latency Duration `json:"latency"`
	// Jitter adds a uniformly distributed [0, Jitter) on top of Latency.
	Jitter Duration `json:"jitter"`
	// ErrorRate is the fraction of data requests, 0..1, answered 500.
	ErrorRate float64 `json:"errorRate"`
	// RateLimit is the number of data requests per second above which the server answers 429 with
	// a Retry-After header. 0 turns it off.
	RateLimit float64 `json:"rateLimit"`
	// RateBurst is the burst of the rate limit; 0 means one second's worth, at least 1.
	RateBurst int `json:"rateBurst"`
	// RetryAfter, when set, is the Retry-After sent with 429 and 503 answers; otherwise 429 answers
	// name the time until the rate limit admits a request (whole seconds, at least 1) and 503
	// answers name none.
	RetryAfter Duration `json:"retryAfter"`
	// Outage answers 503 to every data request.
	Outage bool `json:"outage"`
	// ShortPolls answers every change-feed poll at once with no changes and the revision it
	// asked for, as a proxy between client and server that cannot hold long polls open and
	// answers them empty: the client sees nothing change, whatever changes.
	ShortPolls bool `json:"shortPolls"`
	// FailPolls answers every change-feed poll 504, as a proxy whose timeout is shorter than a
	// long poll; key reads are answered as usual.
	FailPolls bool `json:"failPolls"`
	// AlternateEpochs answers every other change-feed poll of a domain with another epoch, as
	// two config centers with their own histories behind a round-robin load balancer: a
	// client sees the source lose its history at every poll.
	AlternateEpochs bool `json:"alternateEpochs"`
}

// Validate rejects settings that make no sense rather than clamping them silently.
func (f Faults) Validate() error {
	var errs []error
	if f.Latency.Duration < 0 || f.Latency.Duration > maxInjectedLatency {
		errs = append(errs, fmt.Errorf("latency %s must be within 0..%s", f.Latency, maxInjectedLatency))
	}
	if f.Jitter.Duration < 0 || f.Jitter.Duration > maxInjectedLatency {
		errs = append(errs, fmt.Errorf("jitter %s must be within 0..%s", f.Jitter, maxInjectedLatency))
	}
	if math.IsNaN(f.ErrorRate) || f.ErrorRate < 0 || f.ErrorRate > 1 {
		errs = append(errs, fmt.Errorf("error rate %v must be within 0..1", f.ErrorRate))
	}
	if math.IsNaN(f.RateLimit) || math.IsInf(f.RateLimit, 0) || f.RateLimit < 0 {
		errs = append(errs, fmt.Errorf("rate limit %v must be a non-negative number", f.RateLimit))
	}
	if f.RateBurst < 0 {
		errs = append(errs, fmt.Errorf("rate burst %d must not be negative", f.RateBurst))
	}
	if f.RetryAfter.Duration < 0 || f.RetryAfter.Duration > time.Hour {
		errs = append(errs, fmt.Errorf("retry-after %s must be within 0..1h", f.RetryAfter))
	}
	return errors.Join(errs...)
}

// injector applies the current Faults to data requests.
type injector struct {
	mu      sync.Mutex
	faults  Faults
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

func (in *injector) set(f Faults) error {
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

func (in *injector) get() Faults {
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
