package externalcache

import (
	"errors"
	"testing"
	"time"
)

// TestFeedHealthRule: the rule of FeedHealthOptions, poll by poll, on a clock the test moves.
func TestFeedHealthRule(t *testing.T) {
	now := time.Unix(0, 0)
	newHealth := func() *feedHealth {
		var o Options
		o.setDefaults()
		h := newFeedHealth(o.FeedHealth, o.FeedRetry.MinInterval)
		h.now = func() time.Time { return now }
		return h
	}
	held, short := 25*time.Second, time.Millisecond
	want := func(t *testing.T, h *feedHealth, step string, why trouble) {
		t.Helper()
		got, err := h.verdict()
		if got != why || (why != troubleNone) != errors.Is(err, ErrFeedUnhealthy) {
			t.Fatalf("after %s: %s (%v), want %s", step, got, err, why)
		}
	}

	t.Run("failing", func(t *testing.T) {
		h := newHealth()
		h.answered("a", 3, short)
		for range 5 {
			h.failed(errors.New("504"))
		}
		now = now.Add(h.opts.FailingFor - time.Second)
		h.failed(errors.New("504"))
		want(t, h, "polls failing for less than FailingFor", troubleNone)
		now = now.Add(time.Second)
		h.failed(errors.New("504"))
		want(t, h, "polls failing for FailingFor", troubleFailing)
		h.answered("a", 0, short)
		want(t, h, "an answer", troubleNone)
		h.failed(errors.New("504"))
		want(t, h, "one more failed poll", troubleNone)
	})
	t.Run("short polls", func(t *testing.T) {
		h := newHealth()
		h.answered("a", 3, short)
		h.answered("a", 0, short)
		h.answered("a", 0, short)
		h.answered("a", 2, short) // changes count neither way
		want(t, h, "two empty answers at once", troubleNone)
		h.answered("a", 0, short)
		want(t, h, "three empty answers at once", troubleShortPolls)
		h.answered("a", 1, short)
		want(t, h, "an answer with changes", troubleShortPolls)
		h.answered("a", 0, held)
		want(t, h, "an empty answer held open", troubleNone)
	})
	t.Run("a restart is no flap", func(t *testing.T) {
		h := newHealth()
		h.answered("a", 3, short)
		if h.historyLost("a", "b") {
			t.Fatal("a first change of epoch is called a flap")
		}
		want(t, h, "a restart", troubleNone)
		h.answered("b", 3, short)
		if h.historyLost("b", "c") {
			t.Fatal("a second restart after an applied answer is called a flap")
		}
		want(t, h, "another restart", troubleNone)
	})
	t.Run("epoch flapping", func(t *testing.T) {
		h := newHealth()
		h.answered("a", 3, short)
		h.historyLost("a", "b")
		h.answered("b", 3, short)
		if !h.historyLost("b", "a") {
			t.Fatal("a return to an earlier epoch is not called a flap")
		}
		want(t, h, "a return to an earlier epoch", troubleEpochFlapping)
		now = now.Add(time.Hour)
		want(t, h, "no answer since", troubleEpochFlapping)
		h.answered("a", 3, short)
		want(t, h, "an answer after EpochStableFor", troubleNone)

		h = newHealth()
		h.answered("a", 3, short)
		h.historyLost("a", "b")
		if !h.historyLost("b", "c") {
			t.Fatal("a second loss of history before an answer is not called a flap")
		}
		h.answered("c", 3, short)
		want(t, h, "an answer within EpochStableFor", troubleEpochFlapping)
	})
}
