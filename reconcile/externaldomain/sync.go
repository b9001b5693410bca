package externaldomain

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/backoff"
)

// syncer keeps one domain's mirror current while its shard is held: it is the consumer of the
// domain's change-feed loop (externalcache.FeedLoop), which it runs.
type syncer struct {
	m      *Mirror
	loop   *loop
	shard  int32
	domain string
	log    logr.Logger
	// stop ends the loop, once the shard is lost.
	stop context.CancelFunc

	keys  map[string]configv1alpha1.MirroredKey
	since int64
	epoch string                         // the config center's history since belongs to
	obj   *configv1alpha1.ExternalDomain // last object read or written
	// synced: the mirror holds what the polls applied. False until the
	// first poll is written, and again after a failure, so that the next
	// successful poll is written even when it changes nothing.
	synced bool
	// resumed: keys and since are a whole mirror the loop started from,
	// not yet written by it.
	resumed bool
	// changed: an answer taken in changed the keys, or the history they
	// belong to, since the mirror was last written.
	changed bool
	// failing: the mirror said Unavailable since the last answer.
	failing bool
	// feedErr is the feed's verdict as the mirror last said it (nil:
	// healthy), and refreshed when every key was last fetched again
	// because of it.
	feedErr   error
	refreshed time.Time
}

// errLost ends a loop whose shard is no longer held.
var errLost = errors.New("shard no longer held")

// run follows the domain's change feed and writes the mirror after each
// change, until ctx ends or the shard is lost. It starts from the mirror
// the previous holder left, so a handover costs no fetch of unchanged keys.
func (s *syncer) run(ctx context.Context) {
	ctx, s.stop = context.WithCancel(ctx)
	defer s.stop()
	s.log.V(1).Info("Mirror sync started")
	defer s.log.V(1).Info("Mirror sync stopped")
	s.keys = map[string]configv1alpha1.MirroredKey{}
	defer func() {
		if s.feedErr != nil {
			mirrorUnhealthyFeeds.Dec()
		}
	}()
	fl, err := externalcache.NewFeedLoop(externalcache.FeedLoopOptions{
		Feed: countedFeed{s.m.opts.Feed}, Domain: s.domain, Retry: s.m.opts.FeedRetry,
		MaxRetryAfter: s.m.opts.MaxRetryAfter, Health: s.m.opts.FeedHealth, Logger: s.log,
		// Missing ends a poll only when the loop holds a mirror it may have
		// to write again (loop.pollContext).
		PollContext: func(ctx context.Context) (context.Context, context.CancelFunc) {
			return s.loop.pollContext(ctx, s.obj != nil)
		},
	})
	if err != nil {
		s.log.Error(err, "Mirror not synced")
		return
	}
	s.resume(ctx, fl)
	fl.Run(ctx, s)
}

// Apply fetches the keys an answer of the change feed changed and takes
// them in, all of them or none: a failed fetch leaves the keys as they were,
// and the loop polls the same revision again. An answer that lists every
// key drops the keys it lacks (kept through a flap, they may have been
// deleted meanwhile). The mirror is written after, by Polled.
func (s *syncer) Apply(ctx context.Context, a externalcache.FeedAnswer) error {
	updates := map[string]*configv1alpha1.MirroredKey{}
	if a.Full {
		for name := range s.keys {
			updates[name] = nil
		}
	}
	for _, ch := range a.Changes {
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
			return err
		}
		updates[ch.Name] = k
	}
	if s.apply(updates) || a.Epoch != s.epoch {
		s.changed = true
	}
	return nil
}

// Polled writes the mirror after a poll when it has something new to say:
// keys or a history taken in, a verdict on the feed's health, a first
// failure (Unavailable, keeping the keys), or a mirror found gone. While
// the feed cannot be trusted it first fetches every key again, every
// RefreshInterval: a change then arrives that late, not never. A write that
// fails is retried before the feed is polled again (writeRetrying).
func (s *syncer) Polled(ctx context.Context, p externalcache.FeedPoll) error {
	if s.loop.takeMissing() {
		s.verify(ctx)
	}
	if p.Interrupted {
		// Missing ended the poll, and nothing of it was applied: write a
		// mirror that is gone now, when the keys held are whole.
		if s.obj == nil && (s.synced || s.resumed) {
			if werr := s.write(ctx, nil); errors.Is(werr, errLost) {
				s.stop()
			} else if werr != nil {
				s.log.Info("Writing the mirror again failed; trying after the next poll", "error", werr.Error())
			}
		}
		return nil
	}
	err := p.Err
	if err == nil {
		s.since, s.epoch = p.Revision, p.Epoch
		if p.Health != nil && s.synced && time.Since(s.refreshed) >= s.m.opts.RefreshInterval {
			refreshed, rerr := s.refresh(ctx)
			s.changed = s.changed || refreshed
			err = rerr
		}
	}
	if err == nil {
		// A mirror found gone (verify) is written again.
		if healthChanged := s.judged(p.Health); s.changed || !s.synced && !p.Flapped || s.synced && s.obj == nil || healthChanged {
			if s.writeRetrying(ctx) != nil {
				s.stop()
				return nil
			}
			s.changed = false
			if !p.Flapped {
				s.synced = true
			}
		}
		if !p.Flapped {
			s.failing = false
		}
		return nil
	}
	if !s.failing {
		s.failing = true
		// Say so on the mirror once; the keys stay as they were. The next
		// answer is written even if nothing changed, so that the mirror
		// says Synced again.
		if werr := s.write(ctx, err); errors.Is(werr, errLost) {
			s.stop()
			return nil
		}
		s.synced = false
	}
	return err
}

// writeRetrying writes the mirror until it is written, backing off between
// tries. A failed write is the API server's failure (a timeout under load, a
// refusal), not the config center's: the mirror does not say Unavailable for
// it, as it did, and the feed is not polled meanwhile, since the write
// carries every change taken in so far. It fails only when the shard is lost
// (errLost) or the loop ends. It steps writeBackoff itself: a step past the
// cap stays at the cap, where wait.ExponentialBackoffWithContext gives up
// once the cap is reached (six tries, about half a minute), and the mirror
// stopped for good (TestRefusedMirrorWriteIsRetried).
func (s *syncer) writeRetrying(ctx context.Context) error {
	delays := writeBackoff.Delays()
	for tries := 1; ; tries++ {
		err := s.write(ctx, nil)
		if err == nil || errors.Is(err, errLost) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if tries == 1 {
			s.log.Info("Writing the mirror failed; trying again", "error", err.Error())
		}
		t := time.NewTimer(delays.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// writeBackoff spaces the tries of a mirror's write: from half a second,
// doubling up to half a minute, each jittered up to half again.
var writeBackoff = backoff.Policy{Initial: 500 * time.Millisecond, Max: 30 * time.Second, Jitter: 0.5}

// resume starts from the mirror in the shard's cache when it is complete,
// at its revision in its epoch: a revision means nothing in another history
// (the config center restarted and its revisions started over), and a
// holder that resumed without the epoch would take the new history's
// answers as news since that revision, and keep for good every key that
// changed or went in the lost one.
func (s *syncer) resume(ctx context.Context, fl *externalcache.FeedLoop) {
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
	fl.Resume(s.since, s.epoch)
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

// fetch reads one key's value; nil when the config center has no such key.
func (s *syncer) fetch(ctx context.Context, name string) (*configv1alpha1.MirroredKey, error) {
	v, err := s.m.opts.Source.Fetch(ctx, externalcache.Key{Domain: s.domain, Name: name})
	switch {
	case errors.Is(err, externalcache.ErrNotFound):
		mirrorFetches.WithLabelValues("value", "ok").Inc()
		return nil, nil
	case err != nil:
		if ctx.Err() == nil {
			// Not counted: a poll that Missing or the loop's end cut short.
			mirrorFetches.WithLabelValues("value", "error").Inc()
		}
		return nil, err
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

// countedFeed counts the mirror's polls of the change feed.
type countedFeed struct{ externalcache.Feed }

func (f countedFeed) Changes(ctx context.Context, domain string, since int64) (externalcache.ChangeSet, error) {
	cs, err := f.Feed.Changes(ctx, domain, since)
	switch {
	case err == nil:
		mirrorFetches.WithLabelValues("changes", "ok").Inc()
	case ctx.Err() == nil:
		// Not counted: a poll that Missing or the loop's end cut short.
		mirrorFetches.WithLabelValues("changes", "error").Inc()
	}
	return cs, err
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

// isGone reports errors after which the object must be read again.
func isGone(err error) bool { return apierrors.IsNotFound(err) || apierrors.IsConflict(err) }
