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
	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
)

// syncer keeps one domain's mirror current while its shard is held.
type syncer struct {
	m      *Mirror
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
	synced   bool
	failures int
}

// errLost ends a loop whose shard is no longer held.
var errLost = errors.New("shard no longer held")

// run polls the change feed and writes the mirror after each change, until
// ctx ends or the shard is lost. It starts from the mirror the previous
// holder left, so a handover costs no fetch of unchanged keys.
func (s *syncer) run(ctx context.Context) {
	s.log.V(1).Info("Mirror sync started")
	defer s.log.V(1).Info("Mirror sync stopped")
	s.keys = map[string]configv1alpha1.MirroredKey{}
	s.resume(ctx)
	for ctx.Err() == nil {
		start := time.Now()
		changed, err := s.poll(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil && (changed || !s.synced) {
			err = s.write(ctx, nil)
			if err == nil {
				s.synced = true
			}
		}
		if errors.Is(err, errLost) {
			return
		}
		if err != nil {
			s.failures++
			d := s.backoff(err)
			if s.failures == 1 {
				s.log.Info("Mirror sync failed; backing off", "error", err.Error(), "retryIn", d)
				// Say so on the mirror once; the keys stay as they were.
				if werr := s.write(ctx, err); errors.Is(werr, errLost) {
					return
				}
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
	if !meta.IsStatusConditionTrue(ed.Status.Conditions, ConditionSynced) {
		return
	}
	for _, k := range ed.Status.Keys {
		s.keys[k.Name] = k
	}
	s.since, s.epoch = ed.Status.Revision, ed.Status.Epoch
}

// poll applies one answer of the change feed: deleted keys leave, changed
// keys are fetched. Nothing is applied unless every fetch succeeded, so a
// failed poll is retried from the same revision. When the config center
// lost its history, the domain is read again from revision 0 at once, and
// written only from that answer: the mirror never says Synced with the
// keys emptied in between.
func (s *syncer) poll(ctx context.Context) (changed bool, err error) {
	src := s.m.opts.Source
	cs, err := s.changes(ctx)
	if err != nil {
		return false, err
	}
	if lostHistory(s.since, s.epoch, cs) {
		s.log.Info("Config center lost its history (restarted?); resynchronising the mirror",
			"hadRevision", s.since, "revision", cs.Revision, "hadEpoch", s.epoch, "epoch", cs.Epoch)
		s.since, s.epoch, s.synced = 0, cs.Epoch, false
		s.keys = map[string]configv1alpha1.MirroredKey{}
		if cs, err = s.changes(ctx); err != nil {
			return false, err
		}
		if lostHistory(s.since, s.epoch, cs) {
			return false, fmt.Errorf("the change feed answered epoch %q right after %q: its history changed again", cs.Epoch, s.epoch)
		}
	}
	s.epoch = cs.Epoch
	updates := map[string]*configv1alpha1.MirroredKey{}
	for _, ch := range cs.Changes {
		if cur, ok := s.keys[ch.Name]; ok && cur.Revision == ch.Revision && !ch.Deleted {
			continue
		}
		if ch.Deleted {
			updates[ch.Name] = nil
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, s.m.opts.FetchTimeout)
		v, err := src.Fetch(fctx, externalcache.Key{Domain: s.domain, Name: ch.Name})
		cancel()
		switch {
		case errors.Is(err, externalcache.ErrNotFound):
			mirrorFetches.WithLabelValues("value", "ok").Inc()
			updates[ch.Name] = nil
		case err != nil:
			mirrorFetches.WithLabelValues("value", "error").Inc()
			return false, fmt.Errorf("fetching %s: %w", ch.Name, err)
		default:
			mirrorFetches.WithLabelValues("value", "ok").Inc()
			updates[ch.Name] = &configv1alpha1.MirroredKey{Name: ch.Name, Value: string(v.Data), Revision: v.Revision}
		}
	}
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
	s.since = cs.Revision
	return changed, nil
}

// changes polls the domain's change feed from s.since.
func (s *syncer) changes(ctx context.Context) (externalcache.ChangeSet, error) {
	cs, err := s.m.opts.Source.Changes(ctx, s.domain, s.since)
	if err != nil {
		mirrorFetches.WithLabelValues("changes", "error").Inc()
		return cs, fmt.Errorf("polling the change feed: %w", err)
	}
	mirrorFetches.WithLabelValues("changes", "ok").Inc()
	return cs, nil
}

// lostHistory reports whether a change-feed answer belongs to another
// history than since and epoch: its revision went back, or it names
// another epoch. A mirror written before the epoch was recorded (an epoch
// of "" at a revision above 0) cannot tell, and is read again once when the
// config center names one.
func lostHistory(since int64, epoch string, cs externalcache.ChangeSet) bool {
	return cs.Revision < since || cs.Epoch != epoch && (epoch != "" || since > 0)
}

// backoff is exponential with equal jitter, never shorter than a
// Retry-After the config center asked for, up to MaxRetryAfter.
func (s *syncer) backoff(err error) time.Duration {
	o := s.m.opts
	d := o.RetryMax
	if s.failures < 30 {
		d = min(o.RetryMax, o.RetryBase<<(s.failures-1))
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
