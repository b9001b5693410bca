package sharding

import "testing"

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
