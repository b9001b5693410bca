package audit

import (
	"testing"
	"time"
)

func TestFindOverlapsSameReplicaIsNotAnOverlap(t *testing.T) {
	t0 := time.Now()
	byObject := map[string][]Interval{"ns/x": {
		{Replica: "a", Start: t0, End: t0.Add(time.Second)},
		{Replica: "a", Start: t0.Add(time.Millisecond), End: t0.Add(2 * time.Second)},
	}}
	if o := Overlaps(byObject); len(o) != 0 {
		t.Errorf("overlaps %v: intervals of one replica are not a violation", o)
	}
}
