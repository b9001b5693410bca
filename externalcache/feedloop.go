package externalcache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// FeedLoop follows one domain's change feed for one consumer: the cache follows with one each
// domain its held shards use, and the mirror (reconcile/externaldomain) each domain it mirrors.
// It owns what every reader of a feed must get right the same way, so that they cannot drift
// apart: listing the domain again when the source lost its history, backing off after failures
// and while the source's histories flap (never sooner than a Retry-After), spacing answers that
// came back at once, and judging the feed's health (FeedHealthOptions).
type FeedLoop struct {
	opts   FeedLoopOptions
	since  int64
	epoch  string
	health *feedHealth
}

// FeedLoopOptions configure a FeedLoop.
type FeedLoopOptions struct {
	// Feed is the change feed polled. Required.
	Feed Feed
	// Domain is the domain whose feed is followed. Required.
	Domain string
	// Retry spaces the polls and backs them off; its zero fields take the defaults documented
	// on FeedRetryOptions.
	Retry FeedRetryOptions
	// MaxRetryAfter caps a Retry-After the source sends: a proxy's maintenance page may ask for
	// a day, and the loop would stay stale that long after the source is back. Default 1m.
	MaxRetryAfter time.Duration
	// Health decides when the feed is unhealthy; its zero fields take the defaults documented on
	// FeedHealthOptions.
	Health FeedHealthOptions
	// PollContext, when set, makes the context of each poll and of its Apply from the loop's,
	// so that a consumer that must act before a long poll returns can end it (the mirror, to
	// write again a mirror found deleted). A poll ended so is neither answered nor failed: the
	// loop tells Polled and polls again at once. Default: the loop's context.
	PollContext func(ctx context.Context) (context.Context, context.CancelFunc)
	// Logger receives the loop's logs. Default: discard.
	Logger logr.Logger

	// hold is the cache's Retry-After hold, set on the cache's own loops: no poll is made while
	// it lasts, and a poll's Retry-After extends it, so that the source's "wait" stops fetches
	// and polls alike.
	hold *hold
	// capped counts the Retry-After answers capped at MaxRetryAfter: the cache's metric of its
	// prefix; the default prefix's on a loop of NewFeedLoop's caller.
	capped prometheus.Counter
}

// FeedAnswer is one answer of the feed, for the consumer to take in.
type FeedAnswer struct {
	ChangeSet
	// Full says the answer lists every key of the domain: it was polled from revision 0 (the
	// loop's first poll, or the first after the source lost its history), so a key it lacks
	// is gone.
	Full bool
}

// FeedPoll is how one poll of the feed went, as the consumer's Polled is told.
type FeedPoll struct {
	// Err says why nothing was taken in: the poll failed, or Apply refused its answer. The loop
	// backs off before it polls again, never sooner than a Retry-After that Err carries.
	Err error
	// Flapped says the answer came from a history of the source the loop saw before (several
	// sources behind a load balancer), and was not taken in: the loop lists the domain again,
	// from revision 0 of Epoch, after a backoff rather than at every poll.
	Flapped bool
	// Interrupted says the poll's context (PollContext) ended before its answer was taken in:
	// nothing was, and the loop polls again at once.
	Interrupted bool
	// Revision and Epoch are where the loop stands after the poll: the revision it polls from
	// next, in the source's history Epoch names.
	Revision int64
	Epoch    string
	// Health is the feed's verdict after the poll: nil while it is healthy, and otherwise why
	// not, wrapping ErrFeedUnhealthy.
	Health error
}

// FeedConsumer takes in what a FeedLoop's polls bring.
type FeedConsumer interface {
	// Apply takes in one answer, all of it or none: an error leaves the loop at the revision it
	// polled, which it polls again after a backoff, as after a failed poll. ctx is the poll's
	// (PollContext).
	Apply(ctx context.Context, a FeedAnswer) error
	// Polled is told how every poll went, on the loop's context, but for a poll that found the
	// source restarted, after which the loop lists the domain again at once. An error backs the
	// loop off as a failed poll does.
	Polled(ctx context.Context, p FeedPoll) error
}

// NewFeedLoop validates the options and applies their defaults.
func NewFeedLoop(opts FeedLoopOptions) (*FeedLoop, error) {
	var errs []error
	if opts.Feed == nil {
		errs = append(errs, errors.New("a Feed is required"))
	}
	if opts.Domain == "" {
		errs = append(errs, errors.New("a Domain is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("configuring a change-feed loop: %w", err)
	}
	opts.Retry.setDefaults()
	setDefault(&opts.MaxRetryAfter, time.Minute)
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	if opts.capped == nil {
		opts.capped = metricsFor(DefaultMetricsPrefix).retryAfterCapped
	}
	return &FeedLoop{opts: opts, health: newFeedHealth(opts.Health, opts.Retry.MinInterval)}, nil
}

// Resume starts the loop from revision since of epoch, which the consumer kept (the mirror, where
// the shard's previous holder left it), rather than from revision 0: a handover then costs no
// listing of the domain. That history counts as taken in, so its loss next is a restart of the
// source, not a flap. Call it before Run.
func (l *FeedLoop) Resume(since int64, epoch string) {
	l.since, l.epoch = since, epoch
	l.health.resumed(epoch)
}

// Run polls the feed until ctx is done, hands every answer to c's Apply and tells c's Polled how
// each poll went. Its first poll is from revision 0 (or where Resume says), so that the first
// answer lists every key of the domain. When an answer says the source lost its history (its
// revision went back, or it names another epoch), the loop lists the domain again from revision
// 0: at once after a restart, and after a backoff when the source's histories flap. It backs off
// after failures, never sooner than a Retry-After (capped at MaxRetryAfter), and spaces answers
// without changes by Retry.MinInterval, so that a source that answers long polls at once cannot
// make it spin.
func (l *FeedLoop) Run(ctx context.Context, c FeedConsumer) {
	log := l.opts.Logger
	policy := retryPolicy(l.opts.Retry.BaseDelay, l.opts.Retry.MaxDelay)
	failed, flapped := policy.Delays(), policy.Delays()
	failures, flaps := 0, 0
	for ctx.Err() == nil {
		// The source's Retry-After holds every call, polls included, whoever was told.
		if d := l.holding(); d > 0 {
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		start := time.Now()
		p, changes, again := l.poll(ctx, c)
		if ctx.Err() != nil {
			return
		}
		if again {
			continue
		}
		p.Revision, p.Epoch, p.Health = l.since, l.epoch, l.health.err()
		if err := c.Polled(ctx, p); err != nil && p.Err == nil && !p.Interrupted {
			p.Err = err
		}
		var d time.Duration
		switch {
		case ctx.Err() != nil:
			return
		case p.Interrupted:
			continue
		case p.Err != nil:
			failures++
			d = retryDelay(&failed, p.Err, l.opts.MaxRetryAfter)
			if hint := retryAfterHint(p.Err, l.opts.MaxRetryAfter, l.opts.capped); hint > 0 && l.opts.hold != nil {
				l.opts.hold.extend(hint)
			}
			if failures == 1 {
				log.Info("Following the change feed failed; backing off", "error", p.Err.Error(), "retryIn", d)
			} else {
				log.V(1).Info("Following the change feed failed again", "error", p.Err.Error(), "failures", failures, "retryIn", d)
			}
		case p.Flapped:
			// Listing the domain at once would list it at every poll while the histories
			// alternate.
			flaps++
			d = flapped.Next()
			log.V(1).Info("Change feed source's history flaps; listing the domain again after a backoff",
				"epoch", l.epoch, "flaps", flaps, "retryIn", d)
		default:
			if failures > 0 {
				log.Info("Change feed recovered", "failures", failures)
			}
			failures, flaps = 0, 0
			failed.Reset()
			flapped.Reset()
			if changes == 0 {
				d = l.opts.Retry.MinInterval - time.Since(start)
			}
		}
		if !sleep(ctx, d) {
			return
		}
	}
}

// poll polls the feed once and hands its answer to c. again says the source restarted: the loop
// lists the domain again at once, from revision 0 of the new history, and tells c nothing of
// the poll, so that a consumer never takes in the domain emptied in between.
func (l *FeedLoop) poll(ctx context.Context, c FeedConsumer) (p FeedPoll, changes int, again bool) {
	pctx, end := ctx, context.CancelFunc(func() {})
	if l.opts.PollContext != nil {
		pctx, end = l.opts.PollContext(ctx)
	}
	defer end()
	start := time.Now()
	cs, err := l.opts.Feed.Changes(pctx, l.opts.Domain, l.since)
	took := time.Since(start)
	switch {
	case err != nil && pctx.Err() != nil:
		p.Interrupted = true
	case err != nil:
		l.health.failed(err)
		p.Err = fmt.Errorf("polling the change feed of %s: %w", l.opts.Domain, err)
	case lostHistory(l.since, l.epoch, cs):
		p.Flapped = l.health.historyLost(l.epoch, cs.Epoch)
		if !p.Flapped {
			l.opts.Logger.Info("Change feed source lost its history (restarted?); listing the domain again",
				"hadRevision", l.since, "revision", cs.Revision, "hadEpoch", l.epoch, "epoch", cs.Epoch)
		}
		l.since, l.epoch = 0, cs.Epoch
		again = !p.Flapped
	default:
		err := c.Apply(pctx, FeedAnswer{ChangeSet: cs, Full: l.since == 0})
		switch {
		case err != nil && pctx.Err() != nil:
			p.Interrupted = true
		case err != nil:
			p.Err = err
		default:
			l.since, l.epoch = cs.Revision, cs.Epoch
			l.health.answered(cs.Epoch, len(cs.Changes), took)
			changes = len(cs.Changes)
		}
	}
	return p, changes, again
}

// lostHistory reports whether an answer belongs to another history than since and epoch: its
// revision went back, or it names another epoch. An epoch of "" at a revision above 0 (a mirror
// written before the epoch was recorded) cannot tell, and is listed again once when the source
// names one.
func lostHistory(since int64, epoch string, cs ChangeSet) bool {
	return cs.Revision < since || cs.Epoch != epoch && (epoch != "" || since > 0)
}

// holding is how long the cache's Retry-After hold lasts still, if the loop is the cache's.
func (l *FeedLoop) holding() time.Duration {
	if l.opts.hold == nil {
		return 0
	}
	return l.opts.hold.remaining()
}

// sleep waits d, and reports false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
