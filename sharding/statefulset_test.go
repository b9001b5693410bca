package sharding

import (
	"slices"
	"testing"
)

// TestIntentOf: a replica whose ordinal stays below the StatefulSet's
// desired replicas restarts (keeps its place in the ring); any other leaves.
func TestIntentOf(t *testing.T) {
	for _, tc := range []struct {
		identity, sts string
		desired       int32
		deleting      bool
		want          intent
	}{
		{"kshard-1", "kshard", 3, false, intentRestart},
		{"kshard-2", "kshard", 3, false, intentRestart},
		{"kshard-3", "kshard", 3, false, intentLeave},
		{"kshard-2", "kshard", 2, false, intentLeave},
		{"kshard-0", "kshard", 0, false, intentLeave},
		{"kshard-0", "kshard", 3, true, intentLeave},
		{"kshard-01", "kshard", 3, false, intentLeave},
		{"other-0", "kshard", 3, false, intentLeave},
		{"kshard-0", "", 3, false, intentLeave},
		{"kshard-x", "kshard", 3, false, intentLeave},
	} {
		if got := intentOf(tc.identity, tc.sts, tc.desired, tc.deleting); got != tc.want {
			t.Errorf("%s in %s of %d (deleting %v): %s, want %s", tc.identity, tc.sts, tc.desired, tc.deleting, got, tc.want)
		}
	}
}

// TestUnwanted: the members a StatefulSet no longer wants are its pods at
// or above its desired count; other identities, and every member before the
// StatefulSet was seen or after it is gone, are not.
func TestUnwanted(t *testing.T) {
	members := []string{"kshard-0", "kshard-1", "kshard-2", "kshard-01", "other-3", "kshard-x"}
	w := &statefulSetWatch{name: "kshard"}
	if got := w.unwanted(members); got != nil {
		t.Errorf("before the StatefulSet was seen: %v, want none", got)
	}
	w.seen, w.desired = true, 1
	if got := w.unwanted(members); !slices.Equal(got, []string{"kshard-1", "kshard-2"}) {
		t.Errorf("desired 1: %v, want [kshard-1 kshard-2]", got)
	}
	w.desired = 0
	if got := w.unwanted(members); !slices.Equal(got, []string{"kshard-0", "kshard-1", "kshard-2"}) {
		t.Errorf("desired 0: %v, want [kshard-0 kshard-1 kshard-2]", got)
	}
	var none *statefulSetWatch
	if got := none.unwanted(members); got != nil {
		t.Errorf("without a StatefulSet: %v, want none", got)
	}
}
