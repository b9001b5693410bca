package backoff

import (
	"testing"
	"time"
)

// TestDelaysDoubleUpToMax: without jitter the waits are Initial, doubling, capped at Max, and a
// Reset starts again from Initial.
func TestDelaysDoubleUpToMax(t *testing.T) {
	d := Policy{Initial: 100 * time.Millisecond, Max: time.Second}.Delays()
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := d.Next(); got != w*time.Millisecond {
			t.Fatalf("wait %d = %s, want %s", i, got, w*time.Millisecond)
		}
	}
	d.Reset()
	if got := d.Next(); got != 100*time.Millisecond {
		t.Errorf("after Reset: %s, want Initial", got)
	}
	c := Policy{Initial: time.Second}.Delays()
	for range 3 {
		if got := c.Next(); got != time.Second {
			t.Fatalf("without Max: %s, want every wait Initial", got)
		}
	}
}

// TestJitterLengthensWithinItsFactor: each jittered wait lies in [D, D·(1+Jitter)), where D is
// the unjittered one; and the waits differ (they are spread, not all the same).
func TestJitterLengthensWithinItsFactor(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 50 {
		d := Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5}.Delays()
		for n := range 70 {
			base := min(2*time.Second, 100*time.Millisecond<<min(n, 20))
			got := d.Next()
			if got < base || got >= base+base/2 {
				t.Fatalf("wait %d = %s, outside [%s, %s)", n, got, base, base+base/2)
			}
			seen[got] = true
		}
	}
	if len(seen) < 100 {
		t.Errorf("only %d distinct waits in 3,500: not spread", len(seen))
	}
}

func TestBetween(t *testing.T) {
	for range 1000 {
		if got := Between(time.Second, 2*time.Second); got < time.Second || got >= 2*time.Second {
			t.Fatalf("Between(1s, 2s) = %s", got)
		}
	}
	if got := Between(time.Second, time.Second); got != time.Second {
		t.Errorf("Between(1s, 1s) = %s, want 1s", got)
	}
	if got := Jitter(time.Second, 0); got != time.Second {
		t.Errorf("Jitter(1s, 0) = %s, want 1s", got)
	}
}

// TestWaitIsThePolicy: the wait.Backoff handed to client-go steps as the policy's Delays do.
func TestWaitIsThePolicy(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: 300 * time.Millisecond}
	w, d := p.Wait(), p.Delays()
	for i := range 6 {
		if a, b := w.Step(), d.Next(); a != b {
			t.Fatalf("step %d: wait.Backoff %s, Delays %s", i, a, b)
		}
	}
}
