package sharding

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// writeOnce is a reconciler that, like every kshard reconciler, returns
// without an error when WriteContext refuses its write.
type writeOnce struct {
	r     *Replica
	wrote int
	after func() // runs once the write was refused or done
}

func (w *writeOnce) Reconcile(ctx context.Context, req Request) (reconcile.Result, error) {
	defer w.after()
	_, done, ok := w.r.WriteContext(ctx, req.Shard)
	if !ok {
		return reconcile.Result{}, nil
	}
	done()
	w.wrote++
	return reconcile.Result{}, nil
}

// TestRefusedWriteIsRetried: a reconcile whose write WriteContext refused
// while its shard stayed held (the hold lapsed for a moment: a renewal whose
// success was recorded after the renew deadline, under CPU starvation) is
// retried, not dropped; a shard that stopped meanwhile drops it, since its
// next holder lists every object. The sharded controller dropped it: the
// object stayed unreconciled until its next change.
func TestRefusedWriteIsRetried(t *testing.T) {
	const n = 3
	e := &env{opts: Options{RenewDeadline: 4 * time.Second, RetryPeriod: time.Second}, log: logr.Discard(),
		metrics: newRingMetrics(DefaultMetricsPrefix, "refused-write")}
	c := &coordinator{env: e, shards: map[int32]*shard{}}
	r := &Replica{env: e, coord: c}
	s := newShard(c, n)
	c.shards[n] = s
	s.state = stateActive
	req := Request{Shard: n, NamespacedName: types.NamespacedName{Namespace: "ns", Name: "cb"}}

	for _, tc := range []struct {
		name      string
		lastRenew time.Time
		after     func()
		wantRetry bool
		wantWrote int
	}{
		{name: "held", lastRenew: time.Now(), wantWrote: 1},
		{name: "hold lapsed, shard still held", lastRenew: time.Now().Add(-5 * time.Second), wantRetry: true},
		{name: "hold lapsed, shard stopped", lastRenew: time.Now().Add(-5 * time.Second),
			after: func() { s.mu.Lock(); s.fire(eventStop); s.mu.Unlock() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.mu.Lock()
			s.lastRenew = tc.lastRenew
			s.mu.Unlock()
			w := &writeOnce{r: r, after: func() {}}
			if tc.after != nil {
				w.after = tc.after
			}
			res, err := (&guard{c: c, inner: w}).Reconcile(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if retried := res.RequeueAfter > 0; retried != tc.wantRetry {
				t.Errorf("requeued after %s, want a retry: %v", res.RequeueAfter, tc.wantRetry)
			}
			if tc.wantRetry && res.RequeueAfter > e.opts.RetryPeriod {
				t.Errorf("retried after %s, later than a retry period (%s)", res.RequeueAfter, e.opts.RetryPeriod)
			}
			if w.wrote != tc.wantWrote {
				t.Errorf("%d writes, want %d", w.wrote, tc.wantWrote)
			}
		})
	}
}
