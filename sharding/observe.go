package sharding

import (
	"sync"
	"time"
)

// observations time Lease expiry on this replica's own monotonic clock,
// from when it saw each Lease's record change, as client-go's leader
// election does. A holder's written renew time says when it renewed by its
// wall clock: a replica whose clock runs 30 s ahead would find every live
// Lease expired, and one 30 s behind would look dead to everyone. A record
// that keeps changing is live whatever the times in it say.
type observations struct {
	mu   sync.Mutex
	seen map[string]observation
}

// observation is one Lease record as last seen, and when it was first seen
// like this.
type observation struct {
	holder string
	renew  time.Time // as written by the holder: compared, never trusted
	at     time.Time // local, monotonic
}

// expiry returns when a Lease record expires for this replica: its lease
// duration after this replica first saw it. A record seen for the first
// time counts as renewed now.
func (o *observations) expiry(name, holder string, renew time.Time, duration time.Duration, now time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[string]observation{}
	}
	ob, ok := o.seen[name]
	if !ok || ob.holder != holder || !ob.renew.Equal(renew) {
		ob = observation{holder: holder, renew: renew, at: now}
		o.seen[name] = ob
	}
	return ob.at.Add(duration)
}
