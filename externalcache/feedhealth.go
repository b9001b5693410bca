package externalcache

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// trouble says why a domain's change feed is unhealthy; its String is the reason label of
// kshard_externalcache_unhealthy_feeds.
type trouble uint8

const (
	troubleNone trouble = iota
	troubleFailing
	troubleShortPolls
	troubleEpochFlapping
)

// String names the reason for metrics and logs.
func (t trouble) String() string {
	switch t {
	case troubleNone:
		return "none"
	case troubleFailing:
		return "failing"
	case troubleShortPolls:
		return "short_polls"
	case troubleEpochFlapping:
		return "epoch_flapping"
	}
	return fmt.Sprintf("trouble(%d)", uint8(t))
}

// rememberedEpochs bounds the epochs a feed remembers to tell a flap from a restart.
const rememberedEpochs = 8

// feedHealth judges one domain's change feed by the outcome of its polls, with the rule of
// FeedHealthOptions. Every FeedLoop keeps one, the cache's and the mirror's
// (reconcile/externaldomain) alike, so that a feed is judged by one rule wherever it is read. It
// belongs to its loop and is not guarded.
type feedHealth struct {
	opts FeedHealthOptions
	// minInterval is the loop's FeedRetryOptions.MinInterval: an answer without changes sooner than it was not
	// held open.
	minInterval time.Duration
	now         func() time.Time

	failures     int
	failingSince time.Time
	lastErr      error
	shorts       int
	// epochs are the distinct epochs seen, oldest first.
	epochs []string
	// applied says an answer was applied since the last loss of history.
	applied   bool
	flappedAt time.Time
}

// newFeedHealth judges a feed by o, whose zero fields take the defaults documented on
// FeedHealthOptions. minInterval is the loop's spacing of answers without changes
// (FeedRetryOptions.MinInterval): such an answer sooner than it was not held open.
func newFeedHealth(o FeedHealthOptions, minInterval time.Duration) *feedHealth {
	o.setDefaults()
	return &feedHealth{opts: o, minInterval: minInterval, now: time.Now}
}

// resumed records that the loop starts from a revision of epoch it kept (a mirror resuming
// where the shard's previous holder left it): that history counts as applied, so its loss next
// is a restart of the source, not a flap.
func (h *feedHealth) resumed(epoch string) {
	h.applied = true
	h.remember(epoch)
}

// err says why the feed is unhealthy now, wrapping ErrFeedUnhealthy; nil while it is healthy.
func (h *feedHealth) err() error {
	_, err := h.verdict()
	return err
}

// failed records a poll that failed.
func (h *feedHealth) failed(err error) {
	if h.failures == 0 {
		h.failingSince = h.now()
	}
	h.failures++
	h.lastErr = err
}

// answered records an answer the loop applied: of the current epoch, with changes changes,
// that took took.
func (h *feedHealth) answered(epoch string, changes int, took time.Duration) {
	h.failures = 0
	h.applied = true
	h.remember(epoch)
	if changes == 0 {
		if took < h.minInterval {
			h.shorts++
		} else {
			h.shorts = 0
		}
	}
}

// historyLost records an answer that says the source lost its history (another epoch, or a
// revision lower than the one polled), and reports whether it is a flap rather than a restart:
// an epoch seen before, or a second loss before any answer was applied.
func (h *feedHealth) historyLost(from, to string) bool {
	h.failures = 0
	flap := !h.applied || (to != "" && slices.Contains(h.epochs, to))
	h.remember(from)
	h.remember(to)
	h.applied = false
	if flap {
		h.flappedAt = h.now()
	}
	return flap
}

func (h *feedHealth) remember(epoch string) {
	if epoch == "" || slices.Contains(h.epochs, epoch) {
		return
	}
	if len(h.epochs) == rememberedEpochs {
		h.epochs = slices.Delete(h.epochs, 0, 1)
	}
	h.epochs = append(h.epochs, epoch)
}

// verdict is the feed's trouble now, if any, with the error its Lookups carry.
func (h *feedHealth) verdict() (trouble, error) {
	switch {
	case h.failures > 0 && h.now().Sub(h.failingSince) >= h.opts.FailingFor:
		return troubleFailing, fmt.Errorf("%w: its polls have failed since %s, the last with: %v",
			ErrFeedUnhealthy, h.failingSince.UTC().Format(time.RFC3339), h.lastErr)
	case h.shorts >= h.opts.ShortPolls:
		return troubleShortPolls, fmt.Errorf("%w: %d polls in a row came back at once with no changes: long polls are not held open "+
			"(a proxy between the replica and the config center that does not support them, or answers from its cache)", ErrFeedUnhealthy, h.shorts)
	case !h.flappedAt.IsZero() && (!h.applied || h.now().Sub(h.flappedAt) < h.opts.EpochStableFor):
		return troubleEpochFlapping, fmt.Errorf("%w: its answers alternate between histories (epochs %s), as from several config centers "+
			"behind a load balancer", ErrFeedUnhealthy, strings.Join(h.epochs, ", "))
	}
	return troubleNone, nil
}

// feedTrouble is an unhealthy feed's reason and the error its domain's Lookups carry.
type feedTrouble struct {
	why trouble
	err error
}
