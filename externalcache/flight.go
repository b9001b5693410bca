package externalcache

import (
	"fmt"
	"slices"
	"time"

	"github.com/kshard/kshard/internal/backoff"
)

// A flight is the fetch state of one key of one shard while the key is queued, in flight,
// waiting for a retry, or failed. It is the only per-key state on the Go heap, and exists only
// for keys that are not simply cached. Every field is guarded by fetcher.mu.
type flight struct {
	fk    flightKey
	key   Key
	ck    string
	sh    *shard
	state flightState

	attempts   int
	roundStart time.Time
	// retries is the round's backoff, from its first retry on: most flights never retry.
	retries *backoff.Delays
	// err is the last error, reported by Get while the key is pending or stale.
	err error
	// retryAt is when a failed key may be fetched again; timer requeues it then, unless the
	// failure is permanent, in which case the next Get after retryAt does.
	retryAt time.Time
	timer   *time.Timer
	// minRevision is the revision of a change the feed reported while the fetch was under way;
	// a result older than it is fetched again.
	minRevision   int64
	changeDeleted bool
	// notifiedErr is set once OnUpdate was told about a failure, so that a failing key is
	// reported once, and its recovery is reported too.
	notifiedErr bool
	// res is what waiters block on; created by the first waiter, closed on resolution.
	res *resolution
}

type flightKey struct {
	shard int32
	key   Key
}

// flightState is where a flight is in its round of attempts. A flight is created queued (by a
// read, a refresh or a change); a worker takes it in flight; its outcome ends it (stored, or
// discarded when its shard is dropped or the cache stops), puts it in backoff (a retry, or a
// Retry-After hold), or fails it (its round exhausted, or a failure not worth retrying soon).
// Backoff and failed flights are queued again by their timer; a permanently failed one (no timer)
// by the next read after its retry time, or by a change the feed reports.
type flightState uint8

const (
	stateQueued flightState = iota
	stateInflight
	stateBackoff
	stateFailed
)

// String is the state label of kshard_external_fetches_in_flight.
func (s flightState) String() string {
	switch s {
	case stateQueued:
		return "queued"
	case stateInflight:
		return "calling"
	case stateBackoff:
		return "backoff"
	case stateFailed:
		return "failed"
	}
	return fmt.Sprintf("flightState(%d)", uint8(s))
}

// resolution releases every waiter of a flight at once, with the outcome.
type resolution struct {
	done   chan struct{}
	lookup Lookup
}

func (f *flight) resolution() *resolution {
	if f.res == nil {
		f.res = &resolution{done: make(chan struct{})}
	}
	return f.res
}

// release releases the flight's waiters with l and stops its timer.
func (f *flight) release(l Lookup) {
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	if f.res != nil {
		f.res.lookup = l
		close(f.res.done)
		f.res = nil
	}
}

// queue is the bounded line of flights waiting for a worker, and the waits for room in it. It is
// guarded by fetcher.mu.
type queue struct {
	size  int
	ready []*flight
	// space is closed when a worker next takes a flight: Wait and Warm wait on it for room.
	space chan struct{}
	// wake tells idle workers that there is work, one token per worker at most.
	wake chan struct{}
}

func newQueue(size, workers int) queue {
	return queue{size: size, wake: make(chan struct{}, workers)}
}

// push appends f if there is room and wakes a worker.
func (q *queue) push(f *flight) bool {
	if len(q.ready) >= q.size {
		return false
	}
	q.ready = append(q.ready, f)
	select {
	case q.wake <- struct{}{}:
	default:
		// Enough wake-ups are pending: every worker drains the queue before sleeping again.
	}
	return true
}

// next takes the first flight, if any, and makes room.
func (q *queue) next() *flight {
	if len(q.ready) == 0 {
		return nil
	}
	f := q.ready[0]
	q.ready[0] = nil
	q.ready = q.ready[1:]
	q.roomMade()
	return f
}

// take removes and returns the first n flights that match among the first scan of the queue,
// keeping the order of the others, at a cost of scan whatever the queue's length; it makes no
// room (the caller says when).
func (q *queue) take(scan, n int, match func(*flight) bool) []*flight {
	end := min(scan, len(q.ready))
	var out []*flight
	taken := map[*flight]bool{}
	for _, f := range q.ready[:end] {
		if len(out) == n {
			break
		}
		if !taken[f] && match(f) {
			taken[f] = true
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil
	}
	// Close the gaps toward the end of the scanned part, and start the queue after them.
	w := end
	for i := end - 1; i >= 0; i-- {
		if f := q.ready[i]; !taken[f] {
			w--
			q.ready[w] = f
		} else {
			delete(taken, f)
		}
	}
	clear(q.ready[:w])
	q.ready = q.ready[w:]
	return out
}

// remove drops the flights that match; it makes no room (the caller says when).
func (q *queue) remove(match func(*flight) bool) {
	q.ready = slices.DeleteFunc(q.ready, match)
}

// room returns a channel closed when a worker next takes a fetch from the queue.
func (q *queue) room() <-chan struct{} {
	if q.space == nil {
		q.space = make(chan struct{})
	}
	return q.space
}

// roomMade wakes the callers waiting for room in the queue.
func (q *queue) roomMade() {
	if q.space != nil {
		close(q.space)
		q.space = nil
	}
}
