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

	keys     map[string]configv1alpha1.MirroredKey
	since    int64
	epoch    string
	obj      *configv1alpha1.ExternalDomain // last object read or written
	synced   bool                           // the first poll was applied
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

// resume starts from the mirror in the shard's cache when it is complete.
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
	s.since = ed.Status.Revision
}

// poll applies one answer of the change feed: deleted keys leave, changed
// keys are fetched. Nothing is applied unless every fetch succeeded, so a
// failed poll is retried from the same revision.
func (s *syncer) poll(ctx context.Context) (changed bool, err error) {
	src := s.m.opts.Source
	cs, err := src.Changes(ctx, s.domain, s.since)
	if err != nil {
		mirrorFetches.WithLabelValues("changes", "error").Inc()
		return false, fmt.Errorf("polling the change feed: %w", err)
	}
	mirrorFetches.WithLabelValues("changes", "ok").Inc()
	if cs.Revision < s.since || (s.epoch != "" && cs.Epoch != s.epoch) {
		s.log.Info("Config center lost its history (restarted?); resynchronising the mirror",
			"hadRevision", s.since, "revision", cs.Revision)
		s.since, s.epoch = 0, cs.Epoch
		s.keys = map[string]configv1alpha1.MirroredKey{}
		return true, nil
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
