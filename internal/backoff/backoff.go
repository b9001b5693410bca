// Package backoff is the one retry policy of kshard's libraries and the one place where waits are
// spread at random. Every loop that tries again after a failure (a shard Lease not taken, a
// fenced shard, a failed watch, fetch, change-feed poll, authorization check or mirror write)
// waits by a Policy, so that the loops differ only in their numbers; and every wait that is
// spread so that callers that failed, or started, together do not come back together (a retry,
// a soft TTL, a first renewal) draws from Between, so that there is one rule for it.
package backoff

import (
	"math"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Policy says how long to wait before trying again after failures in a row: Initial after the
// first, twice as long after each further one up to Max, each wait then lengthened at random by
// up to Jitter of it. The zero Policy never waits; every user names its own numbers, since what
// a retry costs differs (a Lease write, a call to a config center, a relist).
type Policy struct {
	// Initial is the wait after the first failure. Required: zero never waits.
	Initial time.Duration
	// Max caps the doubling: no wait after the first is longer, before its jitter. Zero: every
	// wait is Initial.
	Max time.Duration
	// Jitter lengthens each wait by a random fraction of it below Jitter (0.2: up to 20% longer),
	// so that the callers that failed together spread their retries. Zero: none.
	Jitter float64
}

// Delays starts a run of failures in a row: its Next waits grow from Initial.
func (p Policy) Delays() Delays { return Delays{policy: p} }

// Wait is the policy as apimachinery's wait.Backoff, for client-go code that takes one (a
// reflector); that code steps and jitters it itself, by the same rule.
func (p Policy) Wait() *wait.Backoff {
	return &wait.Backoff{Duration: p.Initial, Factor: 2, Jitter: p.Jitter, Cap: p.ceiling(), Steps: math.MaxInt32}
}

func (p Policy) ceiling() time.Duration {
	if p.Max <= 0 {
		return p.Initial
	}
	return p.Max
}

// Delays are the waits of one run of failures in a row, by its Policy. It is not safe for
// concurrent use; each loop, or each key, keeps its own.
type Delays struct {
	policy  Policy
	next    time.Duration
	started bool
}

// Next is the wait before the next try: Initial the first time, then doubling up to Max, each
// jittered by Policy.Jitter.
func (d *Delays) Next() time.Duration {
	if !d.started {
		d.started, d.next = true, d.policy.Initial
	}
	w := d.next
	d.next = min(2*d.next, d.policy.ceiling())
	return Jitter(w, d.policy.Jitter)
}

// Reset starts the run again: the next wait is Initial. Call it when a try succeeded.
func (d *Delays) Reset() { d.next, d.started = 0, false }

// Jitter is d lengthened by a random fraction of it below maxFactor: uniform in
// [d, d·(1+maxFactor)). A maxFactor of zero or less leaves d as it is.
func Jitter(d time.Duration, maxFactor float64) time.Duration {
	if maxFactor <= 0 {
		return d
	}
	return Between(d, d+time.Duration(maxFactor*float64(d)))
}

// Between is a wait drawn uniformly from [lo, hi); lo when hi is not above it. It is the only
// source of randomness of every wait kshard spreads.
func Between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rand.Float64()*float64(hi-lo))
}
