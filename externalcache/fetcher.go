package externalcache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/kshard/kshard/internal/backoff"
)

// fetcher brings keys into the store: it keeps a flight per key of a shard that is queued, in
// flight, backing off or failed (never two for one key), a bounded queue and the workers that
// drain it through the guard, and decides from each outcome whether to store, retry or fail.
// It tells the notifier when a key arrived, changed, failed or recovered. It also owns the
// refreshes of keys whose domain's feed is unhealthy (fallback), which are fetches it schedules.
type fetcher struct {
	opts     Options
	log      logr.Logger
	guard    *guard
	notifier *notifier
	// batch is the source when it reads a domain's keys together (BatchSource and a MaxBatch
	// above 1); nil fetches every key alone.
	batch BatchSource
	// ctx is the cache's lifetime: no flight is created once it ended.
	ctx context.Context

	// mu guards the flights, the queue and the fallback timers.
	mu       sync.Mutex
	flights  map[flightKey]*flight
	queue    queue
	fallback fallback
}

func newFetcher(ctx context.Context, opts Options, g *guard, n *notifier, feedErr func(domain string) error, metrics *cacheMetrics, log logr.Logger) *fetcher {
	f := &fetcher{opts: opts, log: log, guard: g, notifier: n, ctx: ctx,
		flights: map[flightKey]*flight{}, queue: newQueue(opts.QueueSize, opts.Workers)}
	f.fallback = fallback{f: f, feedErr: feedErr, refreshes: metrics.fallbackRefreshes, timers: map[flightKey]*ttlTimer{}}
	if b, ok := opts.Source.(BatchSource); ok && opts.MaxBatch > 1 {
		f.batch = b
	}
	return f
}

// admit answers a read that needs more than a fresh hit (Get), enqueuing a fetch unless the key
// already has a flight. full says the key needed a fetch but the queue had no room.
func (f *fetcher) admit(sh *shard, key Key, ck string) (l Lookup, full bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, _, full = f.admitLocked(sh, key, ck)
	return l, full
}

// enqueue is admit for a caller that waits for room (Warm): room is set when the queue is full,
// and closed when it next has room.
func (f *fetcher) enqueue(sh *shard, key Key, ck string) (l Lookup, room <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, _, full := f.admitLocked(sh, key, ck)
	if full {
		return l, f.queue.room()
	}
	return l, nil
}

// await is admit for a caller that waits for the key (Wait): res, when set, is resolved with the
// key's flight; room, when set, is closed when the full queue next has room. With neither, l is
// the answer: the key is cached, not found, failed, or cannot be fetched.
func (f *fetcher) await(sh *shard, key Key, ck string) (l Lookup, res *resolution, room <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, fl, full := f.admitLocked(sh, key, ck)
	switch {
	case errors.Is(l.Err, errDomainReleased):
		return l, nil, nil // the caller uses the domain again
	case full:
		return l, nil, f.queue.room()
	case l.State != StatePending || fl == nil || fl.state == stateFailed:
		f.fallback.armLocked(sh, key, ck)
		return l, nil, nil
	}
	return l, fl.resolution(), nil
}

// admitLocked answers a lookup that needs more than a fresh hit, enqueuing a fetch unless the key
// already has a flight (dedupe: one key is never queued twice). It returns the key's flight, if
// any, and full when the key needed a fetch but the queue had no room.
func (f *fetcher) admitLocked(sh *shard, key Key, ck string) (l Lookup, fl *flight, full bool) {
	// Read again under the lock: a fetch stores its result before it removes its flight, so
	// this read cannot miss a result and start a second fetch.
	l, ok := sh.lookup(ck, f.opts.Clock.Now())
	if ok && (l.State == StateFresh || l.State == StateNotFound) {
		return l, nil, false
	}
	if !ok {
		l = Lookup{State: StatePending}
	}
	if err := f.endedLocked(sh); err != nil {
		l.Err = fmt.Errorf("fetching %s: %w", key, err)
		return l, nil, false
	}
	if !sh.usesDomain(key.Domain) {
		// Released since the caller used it: a flight now would store an entry of a domain the
		// shard no longer uses, which no feed keeps fresh and no later release deletes. The
		// caller uses the domain again and asks once more.
		l.Err = fmt.Errorf("fetching %s: %w", key, errDomainReleased)
		return l, nil, false
	}
	fk := flightKey{shard: sh.id, key: key}
	fl = f.flights[fk]
	switch {
	case fl == nil:
		fl = &flight{fk: fk, key: key, ck: ck, sh: sh, state: stateQueued}
		if !f.queue.push(fl) {
			return l, nil, true
		}
		f.flights[fk] = fl
	case fl.state == stateFailed && fl.timer == nil && !time.Now().Before(fl.retryAt):
		// A permanent failure is retried on demand once its retry time has passed.
		if f.queue.push(fl) {
			fl.state = stateQueued
		}
		l.Err = fl.err
	default:
		l.Err = fl.err
	}
	return l, fl, false
}

// endedLocked reports why no fetch may be created for sh: the cache stopped, or the shard was
// dropped (a caller that looked the shard up before DropShard must not bring back a fetch that
// nothing would ever complete or remove).
func (f *fetcher) endedLocked(sh *shard) error {
	switch {
	case f.ctx.Err() != nil:
		return ErrStopped
	case sh.dropped.Load():
		return ErrShardDropped
	}
	return nil
}

// work is one fetch worker, until the cache stops.
func (f *fetcher) work() {
	for {
		switch fls := f.pop(); len(fls) {
		case 0:
			select {
			case <-f.queue.wake:
			case <-f.ctx.Done():
				return
			}
		case 1:
			f.fetch(fls[0])
		default:
			f.fetchBatch(fls)
		}
	}
}

// pop takes the next queued flight in flight, skipping those that ended meanwhile, and, when the
// source reads a domain's keys together, the other queued flights of its shard's domain, up to
// MaxBatch in all.
func (f *fetcher) pop() []*flight {
	f.mu.Lock()
	defer f.mu.Unlock()
	for fl := f.queue.next(); fl != nil; fl = f.queue.next() {
		if !f.queuedLocked(fl) {
			continue
		}
		fls := []*flight{fl}
		if f.batch != nil {
			// Only the next few flights are looked at: a domain's keys are queued together
			// (a warm-up, a feed's changes), and a pop must not cost the whole queue.
			more := f.queue.take(batchScan*f.opts.MaxBatch, f.opts.MaxBatch-1, func(o *flight) bool {
				return o != fl && o.sh == fl.sh && o.key.Domain == fl.key.Domain && f.queuedLocked(o)
			})
			if len(more) > 0 {
				fls = append(fls, more...)
				f.queue.roomMade()
			}
		}
		now := time.Now()
		for _, fl := range fls {
			fl.state = stateInflight
			if fl.roundStart.IsZero() {
				fl.roundStart = now
			}
		}
		return fls
	}
	return nil
}

// batchScan × MaxBatch is how many queued flights a pop looks at for the keys of its domain.
const batchScan = 16

// queuedLocked says fl is its key's flight and waits in the queue.
func (f *fetcher) queuedLocked(fl *flight) bool {
	return f.flights[fl.fk] == fl && fl.state == stateQueued
}

// fetch runs one attempt for fl. A Retry-After hold defers it without spending an attempt; the
// call itself is shared with any other shard fetching the same key (single flight).
func (f *fetcher) fetch(fl *flight) {
	if d := f.guard.hold.remaining(); d > 0 {
		f.mu.Lock()
		f.backoffLocked(fl, d)
		f.mu.Unlock()
		return
	}
	select {
	case r := <-f.guard.shared(fl.key):
		v, _ := r.Val.(Value)
		f.complete(fl, v, r.Err)
	case <-fl.sh.ctx.Done():
		// The shard was dropped (or the cache stopped): DropShard removes its flights, and
		// this one too should it still be there; the shared call, bounded by CallTimeout,
		// finishes for whoever else waits on it.
		f.mu.Lock()
		f.discardLocked(fl)
		f.mu.Unlock()
	}
}

// fetchBatch runs one attempt for flights of one shard's domain with one call of the
// BatchSource, and acts on each key's answer as fetch does on a key's; the call's error is every
// key's. A Retry-After hold defers them all without spending an attempt.
func (f *fetcher) fetchBatch(fls []*flight) {
	if d := f.guard.hold.remaining(); d > 0 {
		f.mu.Lock()
		for _, fl := range fls {
			f.backoffLocked(fl, d)
		}
		f.mu.Unlock()
		return
	}
	sh, domain := fls[0].sh, fls[0].key.Domain
	names := make([]string, len(fls))
	for i, fl := range fls {
		names[i] = fl.key.Name
	}
	type answer struct {
		values []Fetched
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		values, err := f.guard.callBatch(f.batch, domain, names)
		done <- answer{values, err}
	}()
	select {
	case a := <-done:
		for i, fl := range fls {
			if a.err != nil {
				f.complete(fl, Value{}, a.err)
				continue
			}
			f.complete(fl, a.values[i].Value, a.values[i].Err)
		}
	case <-sh.ctx.Done():
		// As in fetch: the call, bounded by CallTimeout, ends by itself.
		f.mu.Lock()
		for _, fl := range fls {
			f.discardLocked(fl)
		}
		f.mu.Unlock()
	}
}

// discardLocked ends the flight of a dropped shard (or a stopped cache), if it is still its
// key's, and tells its waiters why.
func (f *fetcher) discardLocked(fl *flight) {
	if f.flights[fl.fk] != fl {
		return
	}
	err := f.endedLocked(fl.sh)
	if err == nil {
		err = ErrShardDropped
	}
	delete(f.flights, fl.fk)
	fl.release(Lookup{Err: fmt.Errorf("fetching %s: %w", fl.key, err)})
}

// complete acts on the outcome of a fetch.
func (f *fetcher) complete(fl *flight, v Value, err error) {
	class := f.guard.classify(err)
	if class == classOK && len(v.Data) > f.opts.MaxEntryBytes {
		err = fmt.Errorf("%w: value of %s is %d bytes, at most %d fit", ErrEntryTooLarge, fl.key, len(v.Data), f.opts.MaxEntryBytes)
		class = classPermanent
	}
	switch class {
	case classOK, classNotFound:
		f.store(fl, v, class == classNotFound)
	case classCanceled:
		f.mu.Lock()
		if f.flights[fl.fk] == fl {
			delete(f.flights, fl.fk)
			fl.release(Lookup{Err: fmt.Errorf("fetching %s: %w", fl.key, ErrStopped)})
		}
		f.mu.Unlock()
	case classCircuitOpen:
		// Fail fast and come back when the breaker lets probes through.
		f.fail(fl, err, backoff.Jitter(f.opts.Breaker.Timeout, 0.2), true)
	case classPermanent:
		f.fail(fl, err, backoff.Jitter(f.opts.Retry.FailureRetryInterval, 0.2), false)
	case classRetryable:
		hint := f.guard.retryAfter(err)
		if hint > 0 {
			f.guard.hold.extend(hint)
		}
		f.retry(fl, err, hint)
	}
}

// store caches a value or a not-found answer, releases the waiters and notifies OnUpdate when the
// key arrived, changed, or recovered from a reported failure.
func (f *fetcher) store(fl *flight, v Value, negative bool) {
	now := f.opts.Clock.Now()
	e := fl.sh.store.entry(v, negative, now)
	buf := appendEnvelope(make([]byte, 0, envelopeHeaderSize+len(e.value)), e)

	f.mu.Lock()
	if f.flights[fl.fk] != fl {
		// Dropped or stopped while in flight: the result belongs to nobody.
		f.mu.Unlock()
		return
	}
	prev, hadPrev := fl.sh.envelope(fl.ck)
	if hadPrev {
		_, hadPrev = prev.lookup(now)
	}
	evicted, wasEvicted := fl.sh.store.evictions.take(fl.sh.storeKey(fl.ck))
	if err := fl.sh.set(fl.ck, buf); err != nil {
		f.mu.Unlock()
		f.fail(fl, fmt.Errorf("%w: entry of %s is %d bytes: %v", ErrEntryTooLarge, fl.key, len(buf), err),
			backoff.Jitter(f.opts.Retry.FailureRetryInterval, 0.2), false)
		return
	}
	delete(f.flights, fl.fk)
	l, _ := e.lookup(now)
	fl.release(l)
	f.fallback.armLocked(fl.sh, fl.key, fl.ck)
	// A fetch that only brings back what was evicted for room changes nothing for the objects
	// that use the key: notifying would requeue them, and their reads would refetch and evict
	// each other's values in a loop when they do not fit together.
	refill := !hadPrev && wasEvicted && evicted.negative == negative && evicted.revision == e.revision
	changed := !refill && (!hadPrev || prev.negative != negative ||
		(!negative && (prev.revision != v.Revision || !bytes.Equal(prev.value, v.Data))))
	notify := changed || fl.notifiedErr
	// The change feed reported a change newer than what this fetch saw: fetch again.
	if (!negative && fl.minRevision > v.Revision) || (negative && fl.minRevision > 0 && !fl.changeDeleted) {
		f.refreshLocked(fl.sh, fl.key, fl.ck)
	}
	f.mu.Unlock()
	if notify {
		f.notifier.add(fl.fk)
	}
}

// retry schedules another attempt with backoff, or fails the round when attempts or time are
// exhausted. The worker is released either way: waiting is done by a timer.
func (f *fetcher) retry(fl *flight, err error, hint time.Duration) {
	f.mu.Lock()
	if f.flights[fl.fk] != fl {
		f.mu.Unlock()
		return
	}
	fl.err = fmt.Errorf("fetching %s: %w", fl.key, err)
	fl.attempts++
	if fl.retries == nil {
		d := retryPolicy(f.opts.Retry.BaseDelay, f.opts.Retry.MaxDelay).Delays()
		fl.retries = &d
	}
	d := max(fl.retries.Next(), hint)
	if fl.attempts < f.opts.Retry.MaxAttempts && time.Since(fl.roundStart)+d <= f.opts.Retry.MaxElapsed {
		f.backoffLocked(fl, d)
		f.mu.Unlock()
		return
	}
	notify := f.failLocked(fl, err, max(backoff.Jitter(f.opts.Retry.FailureRetryInterval, 0.2), hint), true)
	f.mu.Unlock()
	if notify {
		f.notifier.add(fl.fk)
	}
}

// backoffLocked requeues fl after d without releasing its waiters.
func (f *fetcher) backoffLocked(fl *flight, d time.Duration) {
	if f.flights[fl.fk] != fl {
		return
	}
	fl.state = stateBackoff
	fl.timer = time.AfterFunc(d, func() { f.requeue(fl) })
}

func (f *fetcher) fail(fl *flight, err error, retryIn time.Duration, auto bool) {
	f.mu.Lock()
	notify := f.failLocked(fl, err, retryIn, auto)
	f.mu.Unlock()
	if notify {
		f.notifier.add(fl.fk)
	}
}

// failLocked ends a round of attempts: the key keeps serving what it has (stale or pending)
// with the error, its waiters are released, and it is retried after retryIn — by a timer when
// auto (the source may recover), or by the next Get after that when the failure is permanent.
// It reports whether OnUpdate should be told (the first failure since the key last succeeded).
func (f *fetcher) failLocked(fl *flight, err error, retryIn time.Duration, auto bool) bool {
	if f.flights[fl.fk] != fl {
		return false
	}
	fl.state = stateFailed
	fl.err = fmt.Errorf("fetching %s: %w", fl.key, err)
	fl.attempts = 0
	fl.retries = nil
	fl.roundStart = time.Time{}
	fl.retryAt = time.Now().Add(retryIn)
	l, ok := fl.sh.lookup(fl.ck, f.opts.Clock.Now())
	if !ok {
		l = Lookup{State: StatePending}
	}
	l.Err = fl.err
	fl.release(l)
	if auto {
		fl.timer = time.AfterFunc(retryIn, func() { f.requeue(fl) })
	}
	notify := !fl.notifiedErr
	fl.notifiedErr = true
	if notify {
		f.log.V(1).Info("Fetch failed", "shard", fl.fk.shard, "key", fl.key.String(), "error", err.Error(), "retryIn", retryIn)
	}
	return notify
}

// retryOnRecovery fetches again, each time the breaker closes after an outage, every key whose
// round failed while the source did not answer: those are waiting for their retry time
// (Retry.FailureRetryInterval, up to half a minute on), and the objects that read them would
// stay unavailable that long after the source is back. A key that failed for good (permanent)
// is not among them: it waits for its next Get.
func (f *fetcher) retryOnRecovery(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.guard.recovered:
		}
		f.mu.Lock()
		n := 0
		for _, fl := range f.flights {
			if fl.state != stateFailed || fl.timer == nil {
				continue
			}
			fl.timer.Stop()
			if f.requeueLocked(fl) {
				n++
			}
		}
		f.mu.Unlock()
		if n > 0 {
			f.log.Info("Source answers again; fetching the keys that failed meanwhile", "keys", n)
		}
	}
}

// requeue puts a flight waiting for a retry back in the queue, or tries again a little later when
// the queue is full.
func (f *fetcher) requeue(fl *flight) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.flights[fl.fk] != fl || (fl.state != stateBackoff && fl.state != stateFailed) || f.ctx.Err() != nil {
		return
	}
	f.requeueLocked(fl)
}

// requeueLocked queues fl and says so, or, with the queue full, has it
// tried again a little later.
func (f *fetcher) requeueLocked(fl *flight) bool {
	fl.timer = nil
	if f.queue.push(fl) {
		fl.state = stateQueued
		return true
	}
	fl.timer = time.AfterFunc(backoff.Jitter(time.Second, 1), func() { f.requeue(fl) })
	return false
}

// refreshLocked makes sure a cached key is fetched again: its entry stops being fresh (a
// not-found answer is forgotten) and a fetch is enqueued unless one is under way. If the queue is
// full, the next Get of the now stale key enqueues it.
func (f *fetcher) refreshLocked(sh *shard, key Key, ck string) {
	if f.endedLocked(sh) != nil || !sh.usesDomain(key.Domain) {
		return
	}
	sh.expire(ck, f.opts.Clock.Now())
	fk := flightKey{shard: sh.id, key: key}
	fl := f.flights[fk]
	switch {
	case fl == nil:
		fl = &flight{fk: fk, key: key, ck: ck, sh: sh, state: stateQueued}
		if f.queue.push(fl) {
			f.flights[fk] = fl
		}
	case fl.state == stateFailed && fl.timer == nil:
		if f.queue.push(fl) {
			fl.state = stateQueued
		}
	}
}

// changed acts in sh on a change of key the feed reported: a fetch under way or pending is made
// to bring at least the change's revision; a cached entry of another revision (or existence) is
// refreshed; and when nothing servable is cached, the shard is told through OnUpdate.
func (f *fetcher) changed(sh *shard, key Key, ck string, ch Change, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl := f.flights[flightKey{shard: sh.id, key: key}]; fl != nil {
		// A fetch is under way or pending: make sure its result is at least this new.
		if ch.Revision > fl.minRevision {
			fl.minRevision, fl.changeDeleted = ch.Revision, ch.Deleted
		}
		if fl.state == stateFailed && fl.timer == nil && f.queue.push(fl) {
			fl.state = stateQueued
		}
		return
	}
	e, ok := sh.envelope(ck)
	if ok {
		_, ok = e.lookup(now)
	}
	var outdated bool
	switch {
	case !ok:
		// Nothing servable cached (expired, evicted, or never read by this shard): fetching
		// it for nobody would cost a call per change, but the objects that read it must hear
		// of it, or they keep their old value until their next resync. Their next Get
		// fetches it.
		f.notifier.add(flightKey{shard: sh.id, key: key})
	case e.negative:
		outdated = !ch.Deleted
	default:
		outdated = ch.Revision != e.revision || ch.Deleted
	}
	if outdated {
		f.refreshLocked(sh, key, ck)
	}
}

// dropShard ends every flight of a dropped shard (their waiters get ErrShardDropped) and its
// fallback timers, and reports how many flights it ended. No flight is created for the shard
// afterwards: the caller marked it dropped first.
func (f *fetcher) dropShard(sh *shard) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	discarded := 0
	for fk, fl := range f.flights {
		if fl.sh == sh {
			delete(f.flights, fk)
			fl.release(Lookup{Err: fmt.Errorf("fetching %s: %w", fl.key, ErrShardDropped)})
			discarded++
		}
	}
	f.queue.remove(func(fl *flight) bool { return fl.sh == sh })
	f.fallback.disarmLocked(func(_ flightKey, tt *ttlTimer) bool { return tt.sh == sh })
	f.queue.roomMade()
	return discarded
}

// releaseDomain ends the flights and fallback timers of domain in sh (their waiters read the key
// again), and reports how many flights it ended.
func (f *fetcher) releaseDomain(sh *shard, domain string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	discarded := 0
	for fk, fl := range f.flights {
		if fl.sh == sh && fk.key.Domain == domain {
			delete(f.flights, fk)
			fl.release(Lookup{Err: fmt.Errorf("fetching %s: %w", fl.key, errDomainReleased)})
			discarded++
		}
	}
	if discarded > 0 {
		f.queue.remove(func(fl *flight) bool { return fl.sh == sh && fl.key.Domain == domain })
		f.queue.roomMade()
	}
	f.fallback.disarmLocked(func(fk flightKey, tt *ttlTimer) bool { return tt.sh == sh && fk.key.Domain == domain })
	return discarded
}

// stop ends every flight (their waiters get ErrStopped) and timer, once the workers returned.
func (f *fetcher) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for fk, fl := range f.flights {
		delete(f.flights, fk)
		fl.release(Lookup{Err: fmt.Errorf("fetching %s: %w", fl.key, ErrStopped)})
	}
	f.queue.ready = nil
	f.fallback.disarmLocked(func(flightKey, *ttlTimer) bool { return true })
}

// arm has a cached key of sh refreshed at its soft expiry while its domain's feed is unhealthy.
func (f *fetcher) arm(sh *shard, key Key, ck string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fallback.armLocked(sh, key, ck)
}

// feedHealed stops the fallback timers of domain: its feed drives the refreshes again.
func (f *fetcher) feedHealed(domain string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fallback.disarmLocked(func(fk flightKey, _ *ttlTimer) bool { return fk.key.Domain == domain })
}

// counts are the fetches waiting for a worker and the keys with a flight.
func (f *fetcher) counts() (queued, flights int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.queue.ready), len(f.flights)
}

// flightsIn counts the flights in one state.
func (f *fetcher) flightsIn(state flightState) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, fl := range f.flights {
		if fl.state == state {
			n++
		}
	}
	return n
}
