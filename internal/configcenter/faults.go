package configcenter

import (
	"errors"
	"fmt"
	"math"
	"time"
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
