package externaldomain

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
)

// syncer keeps one domain's mirror current while its shard is held.
type syncer struct {
	m      *Mirror
	loop   *loop
	shard  int32
	domain string
	log    logr.Logger

	keys  map[string]configv1alpha1.MirroredKey
	since int64
	epoch string                         // the config center's history since belongs to
	obj   *configv1alpha1.ExternalDomain // last object read or written
	// synced: the mirror holds what the polls applied. False until the
	// first poll is written, and again after a resynchronisation, so that
	// the next successful poll is written even when it changes nothing.
	synced bool
	// resumed: keys and since are a whole mirror the loop started from,
	// not yet written by it; false again once a resynchronisation empties
	// the keys.
	resumed  bool
	failures int
	// health judges the domain's change feed; feedErr is its verdict as
	// the mirror last said it (nil: healthy), and refreshed when every key
	// was last fetched again because of it.
	health    *externalcache.FeedHealth
	feedErr   error
	refreshed time.Time
	flaps     int
}

// errLost ends a loop whose shard is no longer held.
var errLost = errors.New("shard no longer held")

// errFlapped says a poll's answer came from a history seen before: the
// feed alternates between histories (config centers behind a load
// balancer), and relisting at once would list the domain at every poll.
var errFlapped = errors.New("the change feed's history flaps")

// run polls the change feed and writes the mirror after each change, until
// ctx ends or the shard is lost. It starts from the mirror the previous
// holder left, so a handover costs no fetch of unchanged keys.
func (s *syncer) run(ctx context.Context) {
	s.log.V(1).Info("Mirror sync started")
	defer s.log.V(1).Info("Mirror sync stopped")
	s.keys = map[string]configv1alpha1.MirroredKey{}
	s.health = externalcache.NewFeedHealth(s.m.opts.FeedHealth, s.m.opts.MinPollInterval)
	defer func() {
		if s.feedErr != nil {
			mirrorUnhealthyFeeds.Dec()
		}
	}()
	s.resume(ctx)
	for ctx.Err() == nil {
		start := time.Now()
		pctx, endPoll := s.loop.pollContext(ctx, s.obj != nil)
		changed, err := s.poll(pctx)
		interrupted := err != nil && pctx.Err() != nil
		endPoll()
		if ctx.Err() != nil {
			return
		}
		if s.loop.takeMissing() {
			s.verify(ctx)
		}
		if interrupted {
			// Missing ended the poll, and nothing of it was applied: write
			// a mirror that is gone now, when the keys held are whole.
			if s.obj == nil && (s.synced || s.resumed) {
				if werr := s.write(ctx, nil); errors.Is(werr, errLost) {
					return
				} else if werr != nil {
					s.log.Info("Writing the mirror again failed; trying after the next poll", "error", werr.Error())
				}
			}
			continue
		}
		// While the feed cannot be trusted, every key is fetched again
		// every RefreshInterval: a change arrives that late, not never.
		if feedErr := s.health.Err(); feedErr != nil && (err == nil || errors.Is(err, errFlapped)) && s.synced &&
			time.Since(s.refreshed) >= s.m.opts.RefreshInterval {
			refreshed, rerr := s.refresh(ctx)
			changed = changed || refreshed
			if rerr != nil {
				err = rerr
			}
		}
		if err == nil || errors.Is(err, errFlapped) {
			// A mirror found gone (verify) is written again.
			if healthChanged := s.judged(s.health.Err()); changed || !s.synced && err == nil || s.synced && s.obj == nil || healthChanged {
				if s.writeRetrying(ctx) != nil {
					return
				}
				if !errors.Is(err, errFlapped) {
					s.synced = true
				}
			}
		}
		if errors.Is(err, errFlapped) {
			s.flaps++
			d := s.backoff(s.flaps, err)
			s.log.V(1).Info("Change feed's history flaps; polling again after a backoff", "flaps", s.flaps, "retryIn", d)
			sleep(ctx, d)
			continue
		}
		s.flaps = 0
		if err != nil {
			s.failures++
			d := s.backoff(s.failures, err)
			if s.failures == 1 {
				s.log.Info("Mirror sync failed; backing off", "error", err.Error(), "retryIn", d)
				// Say so on the mirror once; the keys stay as they were.
				// The next answer is written even if nothing changed, so
				// that the mirror says Synced again.
				if werr := s.write(ctx, err); errors.Is(werr, errLost) {
					return
				}
				s.synced = false
			}
			sleep(ctx, d)
			continue
		}
		if s.failures > 0 {
			s.log.Info("Mirror sync recovered", "failures", s.failures)
			s.failures = 0
		}
		if !changed {
			if el := time.Since(start); el < s.m.opts.MinPollInterval {
				sleep(ctx, s.m.opts.MinPollInterval-el)
			}
		}
	}
}

// writeRetrying writes the mirror until it is written, backing off between
// tries. A failed write is the API server's failure (a timeout under load, a
// refusal), not the config center's: the mirror does not say Unavailable for
// it, as it did, and the feed is not polled meanwhile, since the write
// carries every change taken in so far. It fails only when the shard is lost
// (errLost) or the loop ends.
func (s *syncer) writeRetrying(ctx context.Context) error {
	for n := 1; ; n++ {
		err := s.write(ctx, nil)
		if err == nil || errors.Is(err, errLost) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d := s.backoff(n, err)
		if n == 1 {
			s.log.Info("Writing the mirror failed; trying again", "error", err.Error(), "retryIn", d)
		}
		sleep(ctx, d)
	}
}

// resume starts from the mirror in the shard's cache when it is complete,
// at its revision in its epoch: a revision means nothing in another history
// (the config center restarted and its revisions started over), and a
// holder that resumed without the epoch would take the new history's
// answers as news since that revision, and keep for good every key that
// changed or went in the lost one.
func (s *syncer) resume(ctx context.Context) {
	reader, ok := s.m.opts.Shards.Reader(s.shard)
	if !ok {
		return
	}
	var ed configv1alpha1.ExternalDomain
	if err := reader.Get(ctx, types.NamespacedName{Name: s.domain}, &ed); err != nil {
		return
	}
	s.obj = &ed
	// A mirror whose feed was unhealthy holds every key too.
	if c := meta.FindStatusCondition(ed.Status.Conditions, ConditionSynced); c == nil ||
		c.Status != metav1.ConditionTrue && c.Reason != ReasonFeedUnhealthy {
		return
	}
	for _, k := range ed.Status.Keys {
		s.keys[k.Name] = k
	}
	s.since, s.epoch = ed.Status.Revision, ed.Status.Epoch
	s.resumed = true
	s.health.Resumed(s.epoch)
}

// verify reads the mirror from the API server once a reader found none in
// the shard's cache, and forgets it when it is gone, so that the next write
// creates it again. A mirror this loop never wrote or resumed from is
// created by its first write anyway.
func (s *syncer) verify(ctx context.Context) {
	if s.obj == nil {
		return
	}
	var ed configv1alpha1.ExternalDomain
	switch err := s.m.opts.APIReader.Get(ctx, types.NamespacedName{Name: s.domain}, &ed); {
	case apierrors.IsNotFound(err):
		s.log.Info("Mirror gone (deleted while the loop ran); writing it again")
		s.obj = nil
	case err != nil:
		if ctx.Err() == nil {
			s.log.Info("Reading the mirror a reader did not find failed; looking again after the next poll", "error", err.Error())
			s.loop.markMissing()
		}
	default:
		s.obj = &ed
	}
}

// poll applies one answer of the change feed: deleted keys leave, changed
// keys are fetched. Nothing is applied unless every fetch succeeded, so a
// failed poll is retried from the same revision. When the config center
// lost its history, the domain is read again from revision 0 at once, and
// written only from that answer: the mirror never says Synced with the
// keys emptied in between.
func (s *syncer) poll(ctx context.Context) (changed bool, err error) {
	cs, took, err := s.changes(ctx)
	if err != nil {
		return false, err
	}
	if lostHistory(s.since, s.epoch, cs) {
		if s.health.HistoryLost(s.epoch, cs.Epoch) {
			// A history seen before: the mirror keeps its keys, which the
			// refresh keeps current, and lists the domain again later.
			s.since, s.epoch = 0, cs.Epoch
			return false, errFlapped
		}
		s.log.Info("Config center lost its history (restarted?); resynchronising the mirror",
			"hadRevision", s.since, "revision", cs.Revision, "hadEpoch", s.epoch, "epoch", cs.Epoch)
		kept, synced, resumed := s.keys, s.synced, s.resumed
		s.since, s.epoch, s.synced, s.resumed = 0, cs.Epoch, false, false
		s.keys = map[string]configv1alpha1.MirroredKey{}
		if cs, took, err = s.changes(ctx); err != nil {
			return false, err
		}
		if lostHistory(s.since, s.epoch, cs) {
			// Not a restart after all: the histories alternate. Keep the
			// keys the mirror holds, as for a flap.
			s.health.HistoryLost(s.epoch, cs.Epoch)
			s.keys, s.synced, s.resumed = kept, synced, resumed
			s.since, s.epoch = 0, cs.Epoch
			return false, errFlapped
		}
	}
	s.epoch = cs.Epoch
	updates := map[string]*configv1alpha1.MirroredKey{}
	if s.since == 0 {
		// An answer from revision 0 lists every key: a key it lacks is gone
		// (kept through a flap, it may have been deleted meanwhile).
		for name := range s.keys {
			updates[name] = nil
		}
	}
	for _, ch := range cs.Changes {
		delete(updates, ch.Name)
		if cur, ok := s.keys[ch.Name]; ok && cur.Revision == ch.Revision && !ch.Deleted {
			continue
		}
		if ch.Deleted {
			updates[ch.Name] = nil
			continue
		}
		k, err := s.fetch(ctx, ch.Name)
		if err != nil {
			return false, err
		}
		updates[ch.Name] = k
	}
	changed = s.apply(updates)
	s.since = cs.Revision
	s.health.Answered(cs.Epoch, len(cs.Changes), took)
	return changed, nil
}

// fetch reads one key's value; nil when the config center has no such key.
func (s *syncer) fetch(ctx context.Context, name string) (*configv1alpha1.MirroredKey, error) {
	fctx, cancel := context.WithTimeout(ctx, s.m.opts.FetchTimeout)
	v, err := s.m.opts.Source.Fetch(fctx, externalcache.Key{Domain: s.domain, Name: name})
	cancel()
	switch {
	case errors.Is(err, externalcache.ErrNotFound):
		mirrorFetches.WithLabelValues("value", "ok").Inc()
		return nil, nil
	case err != nil:
		if ctx.Err() == nil {
			// Not counted: a poll that Missing or the loop's end cut short.
			mirrorFetches.WithLabelValues("value", "error").Inc()
		}
		return nil, fmt.Errorf("fetching %s: %w", name, err)
	}
	mirrorFetches.WithLabelValues("value", "ok").Inc()
	return &configv1alpha1.MirroredKey{Name: name, Value: string(v.Data), Revision: v.Revision}, nil
}

// apply takes in fetched keys (nil: gone), all of them or none: a failed
// fetch leaves the keys as they were. It says whether any changed.
func (s *syncer) apply(updates map[string]*configv1alpha1.MirroredKey) (changed bool) {
	for name, k := range updates {
		if k == nil {
			if _, ok := s.keys[name]; ok {
				delete(s.keys, name)
				changed = true
			}
			continue
		}
		s.keys[name] = *k
		changed = true
	}
	return changed
}

// changes polls the domain's change feed from s.since.
func (s *syncer) changes(ctx context.Context) (externalcache.ChangeSet, time.Duration, error) {
	start := time.Now()
	cs, err := s.m.opts.Source.Changes(ctx, s.domain, s.since)
	if err != nil {
		if ctx.Err() == nil {
			mirrorFetches.WithLabelValues("changes", "error").Inc()
			s.health.Failed(err)
		}
		return cs, 0, fmt.Errorf("polling the change feed: %w", err)
	}
	mirrorFetches.WithLabelValues("changes", "ok").Inc()
	return cs, time.Since(start), nil
}

// refresh fetches every key of the mirror again, the way a change arrives
// while the change feed cannot be trusted. Keys new to the domain arrive
// when the feed heals; a key deleted meanwhile leaves now.
func (s *syncer) refresh(ctx context.Context) (changed bool, err error) {
	updates := map[string]*configv1alpha1.MirroredKey{}
	for name, cur := range s.keys {
		k, err := s.fetch(ctx, name)
		if err != nil {
			return false, err
		}
		if k == nil || k.Revision != cur.Revision || k.Value != cur.Value {
			updates[name] = k
		}
	}
	s.refreshed = time.Now()
	return s.apply(updates), nil
}

// judged takes in the feed's verdict, and says whether it changed from
// the one the mirror last said: healthy or not (the message of a verdict
// that stays unhealthy changes with every poll, and is not rewritten).
func (s *syncer) judged(feedErr error) bool {
	if (feedErr == nil) == (s.feedErr == nil) {
		return false
	}
	if feedErr != nil {
		mirrorUnhealthyFeeds.Inc()
		s.log.Info("Change feed unhealthy; the mirror's keys are fetched again every refresh interval until it heals",
			"error", feedErr.Error(), "refreshInterval", s.m.opts.RefreshInterval)
	} else {
		mirrorUnhealthyFeeds.Dec()
		s.log.Info("Change feed healthy again")
	}
	s.feedErr = feedErr
	return true
}

// lostHistory reports whether a change-feed answer belongs to another
// history than since and epoch: its revision went back, or it names
// another epoch. A mirror written before the epoch was recorded (an epoch
// of "" at a revision above 0) cannot tell, and is read again once when the
// config center names one.
func lostHistory(since int64, epoch string, cs externalcache.ChangeSet) bool {
	return cs.Revision < since || cs.Epoch != epoch && (epoch != "" || since > 0)
}

// backoff is exponential in n (the failures or flaps in a row) with equal
// jitter, never shorter than a Retry-After the config center asked for, up
// to MaxRetryAfter.
func (s *syncer) backoff(n int, err error) time.Duration {
	o := s.m.opts
	d := o.RetryMax
	if n < 30 {
		d = min(o.RetryMax, o.RetryBase<<(n-1))
	}
	d = d/2 + rand.N(d/2+1)
	var h externalcache.RetryAfterHinter
	if errors.As(err, &h) {
		d = max(d, min(h.RetryAfterHint(), o.MaxRetryAfter))
	}
	return d
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// isGone reports errors after which the object must be read again.
func isGone(err error) bool { return apierrors.IsNotFound(err) || apierrors.IsConflict(err) }
