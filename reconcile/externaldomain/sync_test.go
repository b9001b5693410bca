package externaldomain

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache"
)

// retryAfterError is a failure that carries the config center's Retry-After.
type retryAfterError time.Duration

func (e retryAfterError) Error() string                 { return fmt.Sprintf("503, Retry-After %s", time.Duration(e)) }
func (e retryAfterError) RetryAfterHint() time.Duration { return time.Duration(e) }

// TestBackoffCapsRetryAfter: a Retry-After is honoured up to MaxRetryAfter
// (a proxy's "Retry-After: 86400" held a mirror's sync for a day), and a
// shorter one still delays the next poll past the backoff.
func TestBackoffCapsRetryAfter(t *testing.T) {
	s := &syncer{m: &Mirror{opts: Options{RetryBase: 500 * time.Millisecond, RetryMax: 30 * time.Second, MaxRetryAfter: time.Minute}}}
	if d := s.backoff(1, fmt.Errorf("polling the change feed: %w", retryAfterError(24*time.Hour))); d != time.Minute {
		t.Errorf("Retry-After 24h: next poll in %s, want the cap of 1m", d)
	}
	if d := s.backoff(1, retryAfterError(10*time.Second)); d != 10*time.Second {
		t.Errorf("Retry-After 10s: next poll in %s, want 10s", d)
	}
	if d := s.backoff(1, errors.New("connection refused")); d > 500*time.Millisecond {
		t.Errorf("first failure without Retry-After: next poll in %s, want at most the base 500ms", d)
	}
}

// TestLostHistory: which change-feed answers mean that the config center
// lost the history the mirror's revision belongs to.
func TestLostHistory(t *testing.T) {
	for _, tc := range []struct {
		name  string
		since int64
		epoch string
		cs    externalcache.ChangeSet
		lost  bool
	}{
		{"first poll", 0, "", externalcache.ChangeSet{Revision: 7, Epoch: "e1"}, false},
		{"same epoch, on", 7, "e1", externalcache.ChangeSet{Revision: 9, Epoch: "e1"}, false},
		{"revision went back", 7, "e1", externalcache.ChangeSet{Revision: 3, Epoch: "e1"}, true},
		{"another epoch, revision on", 7, "e1", externalcache.ChangeSet{Revision: 900, Epoch: "e2"}, true},
		{"a source without epochs", 7, "", externalcache.ChangeSet{Revision: 9}, false},
		{"a mirror written before epochs were recorded", 7, "", externalcache.ChangeSet{Revision: 9, Epoch: "e1"}, true},
	} {
		if got := lostHistory(tc.since, tc.epoch, tc.cs); got != tc.lost {
			t.Errorf("%s: lostHistory = %v, want %v", tc.name, got, tc.lost)
		}
	}
}
