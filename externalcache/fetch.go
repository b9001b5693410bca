package externalcache

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/kshard/kshard/internal/backoff"
)

// A flight is the fetch state of one key of one shard while the key is queued, in flight,
// waiting for a retry, or failed. It is the only per-key state on the Go heap, and exists only
// for keys that are not simply cached. Every field is guarded by Cache.mu.
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

// flightsIn counts the flights in one state.
func (c *Cache) flightsIn(state flightState) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, f := range c.flights {
		if f.state == state {
			n++
		}
	}
	return n
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

// releaseLocked releases the flight's waiters with l and stops its timer.
func (c *Cache) releaseLocked(f *flight, l Lookup) {
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

// admitLocked answers a lookup that needs more than a fresh hit, enqueuing a fetch unless the key
// already has a flight (dedupe: one key is never queued twice). It returns the key's flight, if
// any, and full when the key needed a fetch but the queue had no room.
func (c *Cache) admitLocked(sh *shard, key Key, ck string) (l Lookup, f *flight, full bool) {
	// Read again under the lock: a fetch stores its result before it removes its flight, so
	// this read cannot miss a result and start a second fetch.
	l, ok := sh.lookup(ck, c.opts.Clock.Now())
	if ok && (l.State == StateFresh || l.State == StateNotFound) {
		return l, nil, false
	}
	if !ok {
		l = Lookup{State: StatePending}
	}
	if err := c.endedLocked(sh); err != nil {
		l.Err = fmt.Errorf("fetching %s: %w", key, err)
		return l, nil, false
	}
	fk := flightKey{shard: sh.id, key: key}
	f = c.flights[fk]
	switch {
	case f == nil:
		f = &flight{fk: fk, key: key, ck: ck, sh: sh, state: stateQueued}
		if !c.pushLocked(f) {
			return l, nil, true
		}
		c.flights[fk] = f
	case f.state == stateFailed && f.timer == nil && !time.Now().Before(f.retryAt):
		// A permanent failure is retried on demand once its retry time has passed.
		if c.pushLocked(f) {
			f.state = stateQueued
		}
		l.Err = f.err
	default:
		l.Err = f.err
	}
	return l, f, false
}

// endedLocked reports why no fetch may be created for sh: the cache stopped, or the shard was
// dropped (a caller that looked the shard up before DropShard must not bring back a fetch that
// nothing would ever complete or remove).
func (c *Cache) endedLocked(sh *shard) error {
	switch {
	case c.ctx.Err() != nil:
		return ErrStopped
	case sh.dropped.Load():
		return ErrShardDropped
	}
	return nil
}

// pushLocked appends f to the ready queue if there is room and wakes a worker.
func (c *Cache) pushLocked(f *flight) bool {
	if len(c.ready) >= c.opts.QueueSize {
		return false
	}
	c.ready = append(c.ready, f)
	select {
	case c.wake <- struct{}{}:
	default:
		// Enough wake-ups are pending: every worker drains the queue before sleeping again.
	}
	return true
}

// roomLocked returns a channel closed when a worker next takes a fetch from the queue.
func (c *Cache) roomLocked() <-chan struct{} {
	if c.space == nil {
		c.space = make(chan struct{})
	}
	return c.space
}

// roomMadeLocked wakes the callers waiting for room in the queue.
func (c *Cache) roomMadeLocked() {
	if c.space != nil {
		close(c.space)
		c.space = nil
	}
}

// work is one fetch worker.
func (c *Cache) work() {
	for {
		if f := c.pop(); f != nil {
			c.fetch(f)
			continue
		}
		select {
		case <-c.wake:
		case <-c.ctx.Done():
			return
		}
	}
}

func (c *Cache) pop() *flight {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.ready) > 0 {
		f := c.ready[0]
		c.ready[0] = nil
		c.ready = c.ready[1:]
		c.roomMadeLocked()
		if c.flights[f.fk] == f && f.state == stateQueued {
			f.state = stateInflight
			if f.roundStart.IsZero() {
				f.roundStart = time.Now()
			}
			return f
		}
	}
	return nil
}

// fetch runs one attempt for f. A Retry-After hold defers it without spending an attempt; the
// call itself is shared with any other shard fetching the same key (single flight).
func (c *Cache) fetch(f *flight) {
	if d := c.hold.remaining(); d > 0 {
		c.mu.Lock()
		c.backoffLocked(f, d)
		c.mu.Unlock()
		return
	}
	ch := c.group.DoChan(f.ck, func() (any, error) { return c.call(f.key) })
	select {
	case r := <-ch:
		v, _ := r.Val.(Value)
		c.complete(f, v, r.Err)
	case <-f.sh.ctx.Done():
		// The shard was dropped (or the cache stopped): DropShard removes its flights, and
		// this one too should it still be there; the shared call, bounded by CallTimeout,
		// finishes for whoever else waits on it.
		c.mu.Lock()
		if c.flights[f.fk] == f {
			err := c.endedLocked(f.sh)
			if err == nil {
				err = ErrShardDropped
			}
			delete(c.flights, f.fk)
			c.releaseLocked(f, Lookup{Err: fmt.Errorf("fetching %s: %w", f.key, err)})
		}
		c.mu.Unlock()
	}
}

// Fetch reads one key from the source now, through the guards of the cache's own fetches: the
// Retry-After hold, the rate limit, the circuit breaker, and the single flight it shares with
// the held shards' fetches of the key. It caches nothing. It is for a reader that keeps values
// elsewhere (the mirror, reconcile/externaldomain), which would otherwise call the source around
// the guards that protect it. A key that does not exist fails with an error wrapping
// ErrNotFound; a call the guards stopped, with one wrapping ErrCircuitOpen, or ErrRetryAfterHold
// with the wait left as its RetryAfterHint.
func (c *Cache) Fetch(ctx context.Context, key Key) (Value, error) {
	if err := key.validate(); err != nil {
		return Value{}, fmt.Errorf("fetching %s: %w", key, err)
	}
	if err := c.hold.err(); err != nil {
		return Value{}, fmt.Errorf("fetching %s: %w", key, err)
	}
	ch := c.group.DoChan(key.cacheKey(), func() (any, error) { return c.call(key) })
	select {
	case r := <-ch:
		if r.Err != nil {
			if hint := retryAfterHint(r.Err, c.opts.MaxRetryAfter, c.metrics.retryAfterCapped); hint > 0 && classify(c.ctx, r.Err) == classRetryable {
				c.hold.extend(hint)
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

// call makes one protected call: rate limit, timeout, circuit breaker. It runs on the cache's
// context rather than a caller's, because its result is shared by every shard waiting for the key.
func (c *Cache) call(key Key) (Value, error) {
	if err := c.limiter.Wait(c.ctx); err != nil {
		return Value{}, fmt.Errorf("waiting for the rate limit: %w", err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.CallTimeout)
	defer cancel()
	v, err := c.breaker.Execute(func() (Value, error) {
		start := time.Now()
		v, err := c.opts.Source.Fetch(ctx, key)
		c.metrics.callDuration.Observe(time.Since(start).Seconds())
		c.metrics.calls.WithLabelValues(callCode(err, classify(c.ctx, err))).Inc()
		return v, err
	})
	if classify(c.ctx, err) == classCircuitOpen {
		err = circuitOpen(err)
	}
	return v, err
}

// complete acts on the outcome of a fetch.
func (c *Cache) complete(f *flight, v Value, err error) {
	class := classify(c.ctx, err)
	if class == classOK && len(v.Data) > c.opts.MaxEntryBytes {
		err = fmt.Errorf("%w: value of %s is %d bytes, at most %d fit", ErrEntryTooLarge, f.key, len(v.Data), c.opts.MaxEntryBytes)
		class = classPermanent
	}
	switch class {
	case classOK, classNotFound:
		c.store(f, v, class == classNotFound)
	case classCanceled:
		c.mu.Lock()
		if c.flights[f.fk] == f {
			delete(c.flights, f.fk)
			c.releaseLocked(f, Lookup{Err: fmt.Errorf("fetching %s: %w", f.key, ErrStopped)})
		}
		c.mu.Unlock()
	case classCircuitOpen:
		// Fail fast and come back when the breaker lets probes through.
		c.fail(f, err, backoff.Jitter(c.opts.Breaker.Timeout, 0.2), true)
	case classPermanent:
		c.fail(f, err, backoff.Jitter(c.opts.Retry.FailureRetryInterval, 0.2), false)
	case classRetryable:
		hint := retryAfterHint(err, c.opts.MaxRetryAfter, c.metrics.retryAfterCapped)
		if hint > 0 {
			c.hold.extend(hint)
		}
		c.retry(f, err, hint)
	}
}

// store caches a value or a not-found answer, releases the waiters and notifies OnUpdate when the
// key arrived, changed, or recovered from a reported failure.
func (c *Cache) store(f *flight, v Value, negative bool) {
	now := c.opts.Clock.Now()
	e := envelope{revision: v.Revision, fetchedAt: now.UnixNano(), negative: negative}
	if negative {
		e.revision = 0
		e.hardExpiry = now.Add(c.opts.NegativeTTL).UnixNano()
		e.softExpiry = e.hardExpiry
	} else {
		e.value = v.Data
		e.softExpiry = now.Add(c.softTTL()).UnixNano()
		e.hardExpiry = now.Add(c.opts.HardTTL).UnixNano()
	}
	buf := appendEnvelope(make([]byte, 0, envelopeHeaderSize+len(e.value)), e)

	c.mu.Lock()
	if c.flights[f.fk] != f {
		// Dropped or stopped while in flight: the result belongs to nobody.
		c.mu.Unlock()
		return
	}
	prev, hadPrev := f.sh.envelope(f.ck)
	if hadPrev {
		_, hadPrev = prev.lookup(now)
	}
	evicted, wasEvicted := c.evictions.take(f.sh.storeKey(f.ck))
	if err := f.sh.set(f.ck, buf); err != nil {
		c.mu.Unlock()
		c.fail(f, fmt.Errorf("%w: entry of %s is %d bytes: %v", ErrEntryTooLarge, f.key, len(buf), err),
			backoff.Jitter(c.opts.Retry.FailureRetryInterval, 0.2), false)
		return
	}
	delete(c.flights, f.fk)
	l, _ := e.lookup(now)
	c.releaseLocked(f, l)
	c.armLocked(f.sh, f.key, f.ck)
	// A fetch that only brings back what was evicted for room changes nothing for the objects
	// that use the key: notifying would requeue them, and their reads would refetch and evict
	// each other's values in a loop when they do not fit together.
	refill := !hadPrev && wasEvicted && evicted.negative == negative && evicted.revision == e.revision
	changed := !refill && (!hadPrev || prev.negative != negative ||
		(!negative && (prev.revision != v.Revision || !bytes.Equal(prev.value, v.Data))))
	notify := changed || f.notifiedErr
	// The change feed reported a change newer than what this fetch saw: fetch again.
	if (!negative && f.minRevision > v.Revision) || (negative && f.minRevision > 0 && !f.changeDeleted) {
		c.refreshLocked(f.sh, f.key, f.ck)
	}
	c.mu.Unlock()
	if notify {
		c.notifier.add(f.fk)
	}
}

// softTTL is SoftTTL ± TTLJitter, so that keys fetched together do not expire together.
func (c *Cache) softTTL() time.Duration {
	d, j := float64(c.opts.SoftTTL), c.opts.TTLJitter
	return backoff.Between(time.Duration(d*(1-j)), time.Duration(d*(1+j)))
}

// retry schedules another attempt with backoff, or fails the round when attempts or time are
// exhausted. The worker is released either way: waiting is done by a timer.
func (c *Cache) retry(f *flight, err error, hint time.Duration) {
	c.mu.Lock()
	if c.flights[f.fk] != f {
		c.mu.Unlock()
		return
	}
	f.err = fmt.Errorf("fetching %s: %w", f.key, err)
	f.attempts++
	if f.retries == nil {
		d := retryPolicy(c.opts.Retry.BaseDelay, c.opts.Retry.MaxDelay).Delays()
		f.retries = &d
	}
	d := max(f.retries.Next(), hint)
	if f.attempts < c.opts.Retry.MaxAttempts && time.Since(f.roundStart)+d <= c.opts.Retry.MaxElapsed {
		c.backoffLocked(f, d)
		c.mu.Unlock()
		return
	}
	notify := c.failLocked(f, err, max(backoff.Jitter(c.opts.Retry.FailureRetryInterval, 0.2), hint), true)
	c.mu.Unlock()
	if notify {
		c.notifier.add(f.fk)
	}
}

// backoffLocked requeues f after d without releasing its waiters.
func (c *Cache) backoffLocked(f *flight, d time.Duration) {
	if c.flights[f.fk] != f {
		return
	}
	f.state = stateBackoff
	f.timer = time.AfterFunc(d, func() { c.requeue(f) })
}

func (c *Cache) fail(f *flight, err error, retryIn time.Duration, auto bool) {
	c.mu.Lock()
	notify := c.failLocked(f, err, retryIn, auto)
	c.mu.Unlock()
	if notify {
		c.notifier.add(f.fk)
	}
}

// failLocked ends a round of attempts: the key keeps serving what it has (stale or pending)
// with the error, its waiters are released, and it is retried after retryIn — by a timer when
// auto (the source may recover), or by the next Get after that when the failure is permanent.
// It reports whether OnUpdate should be told (the first failure since the key last succeeded).
func (c *Cache) failLocked(f *flight, err error, retryIn time.Duration, auto bool) bool {
	if c.flights[f.fk] != f {
		return false
	}
	f.state = stateFailed
	f.err = fmt.Errorf("fetching %s: %w", f.key, err)
	f.attempts = 0
	f.retries = nil
	f.roundStart = time.Time{}
	f.retryAt = time.Now().Add(retryIn)
	l, ok := f.sh.lookup(f.ck, c.opts.Clock.Now())
	if !ok {
		l = Lookup{State: StatePending}
	}
	l.Err = f.err
	c.releaseLocked(f, l)
	if auto {
		f.timer = time.AfterFunc(retryIn, func() { c.requeue(f) })
	}
	notify := !f.notifiedErr
	f.notifiedErr = true
	if notify {
		c.log.V(1).Info("Fetch failed", "shard", f.fk.shard, "key", f.key.String(), "error", err.Error(), "retryIn", retryIn)
	}
	return notify
}

// requeue puts a flight waiting for a retry back in the queue, or tries again a little later when
// the queue is full.
func (c *Cache) requeue(f *flight) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flights[f.fk] != f || (f.state != stateBackoff && f.state != stateFailed) || c.ctx.Err() != nil {
		return
	}
	f.timer = nil
	if c.pushLocked(f) {
		f.state = stateQueued
		return
	}
	f.timer = time.AfterFunc(backoff.Jitter(time.Second, 1), func() { c.requeue(f) })
}

// refreshLocked makes sure a cached key is fetched again: its entry stops being fresh (a
// not-found answer is forgotten) and a fetch is enqueued unless one is under way. If the queue is
// full, the next Get of the now stale key enqueues it.
func (c *Cache) refreshLocked(sh *shard, key Key, ck string) {
	if c.endedLocked(sh) != nil {
		return
	}
	if e, ok := sh.envelope(ck); ok {
		if e.negative {
			sh.delete(ck)
		} else if now := c.opts.Clock.Now().UnixNano(); e.softExpiry > now {
			e.softExpiry = now
			_ = sh.set(ck, appendEnvelope(make([]byte, 0, envelopeHeaderSize+len(e.value)), e))
		}
	}
	fk := flightKey{shard: sh.id, key: key}
	f := c.flights[fk]
	switch {
	case f == nil:
		f = &flight{fk: fk, key: key, ck: ck, sh: sh, state: stateQueued}
		if c.pushLocked(f) {
			c.flights[fk] = f
		}
	case f.state == stateFailed && f.timer == nil:
		if c.pushLocked(f) {
			f.state = stateQueued
		}
	}
}
