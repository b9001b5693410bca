package externalcache

import (
	"slices"
	"testing"
)

// TestQueueTakeLooksOnlyAtItsScan: take returns the first matches of the
// scanned part, at most n, and leaves every other flight in its order,
// those beyond the scan untouched.
func TestQueueTakeLooksOnlyAtItsScan(t *testing.T) {
	names := []string{"a1", "b1", "a2", "c1", "a3", "a4", "b2", "a5"}
	q := newQueue(100, 1)
	for _, n := range names {
		q.push(&flight{key: Key{Domain: n[:1], Name: n}})
	}
	isA := func(f *flight) bool { return f.key.Domain == "a" }
	name := func(fs []*flight) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.key.Name)
		}
		return out
	}
	if got := name(q.take(6, 2, isA)); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Errorf("take(6, 2) = %v, want [a1 a2]", got)
	}
	if got := name(q.ready); !slices.Equal(got, []string{"b1", "c1", "a3", "a4", "b2", "a5"}) {
		t.Errorf("left %v", got)
	}
	if got := name(q.take(4, 10, isA)); !slices.Equal(got, []string{"a3", "a4"}) {
		t.Errorf("take(4, 10) = %v, want [a3 a4]: a5 is beyond the scan", got)
	}
	if got := name(q.ready); !slices.Equal(got, []string{"b1", "c1", "b2", "a5"}) {
		t.Errorf("left %v", got)
	}
	if got := q.take(2, 10, isA); got != nil {
		t.Errorf("take(2, 10) = %v, want none", name(got))
	}
}
