package sharding

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding/lease"
)

// A ring coordinates through three kinds of Lease: each replica's member
// Lease, one Lease per shard, and the labeler's. All three are named and
// judged by package lease (their names and holder identities, and StateOf,
// the one verdict on a Lease), with observations (observe.go) timing their
// expiry on this replica's clock, and written through this file's
// leaseWriter,
// which makes every write conditional on the resourceVersion last read, so
// that of two processes writing one Lease, one wins and the other learns
// that it lost.

// errLeaseHeld is wrapped by take's error when another holder still renews
// the Lease (a *heldError says who).
var errLeaseHeld = errors.New("Lease is held by another live holder")

// errLeaseLost is wrapped by renew's error when the Lease no longer names
// this process.
var errLeaseLost = errors.New("Lease lost")

// heldError says who holds a Lease that could not be taken.
type heldError struct {
	name, holder string
	// unseen is how long this replica has not seen the Lease renewed, of
	// its duration.
	unseen, duration time.Duration
}

func (e *heldError) Error() string {
	return fmt.Sprintf("%s %s: held by %q, not seen renewed for %s of its %s", errLeaseHeld, e.name, e.holder,
		e.unseen.Round(time.Millisecond), e.duration)
}

func (e *heldError) Unwrap() error { return errLeaseHeld }

// leaseWriter writes one Lease for this process. It keeps the Lease as last
// read or written and writes only on top of it. One goroutine owns each.
type leaseWriter struct {
	leases coordinationv1client.LeaseInterface
	name   string
	// labels and annotations are set on every write (others are kept); an
	// annotation "" is removed.
	labels, annotations map[string]string
	// holder is this process's holder identity.
	holder   string
	duration time.Duration
	// clock is the wall clock written into the Lease; expiry is timed on
	// the monotonic clock by observed.
	clock    clock.PassiveClock
	observed *observations
	// cur is the Lease as last read or written; nil: read it before the
	// next write.
	cur *coordinationv1.Lease
}

// read reads the Lease afresh (nil when it does not exist).
func (w *leaseWriter) read(ctx context.Context) error {
	got, err := w.leases.Get(ctx, w.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		w.cur = nil
		return nil
	case err != nil:
		return fmt.Errorf("reading Lease %s: %w", w.name, err)
	}
	w.cur = got
	return nil
}

// state judges the Lease as last read, at now.
func (w *leaseWriter) state(now time.Time) (lease.State, string, time.Time) {
	if w.cur == nil {
		return lease.Absent, "", time.Time{}
	}
	holder := ptr.Deref(w.cur.Spec.HolderIdentity, "")
	renew := time.Time{}
	if w.cur.Spec.RenewTime != nil {
		renew = w.cur.Spec.RenewTime.Time
	}
	expiry := w.observed.expiry(w.name, holder, renew, w.durationOf(w.cur), now)
	return lease.StateOf(true, holder, w.holder, expiry, now), holder, expiry
}

func (w *leaseWriter) durationOf(l *coordinationv1.Lease) time.Duration {
	return time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
}

// take reads the Lease and makes this process its holder, beginning a
// tenure (a new acquire time), if it is absent, free, this process's or
// expired. It returns Takeable's reason, or an error wrapping errLeaseHeld
// when another holder still renews it, or the API server's (a conflict:
// another process wrote it first).
func (w *leaseWriter) take(ctx context.Context) (string, error) {
	if err := w.read(ctx); err != nil {
		return "", err
	}
	now := time.Now()
	st, holder, expiry := w.state(now)
	reason, ok := st.Takeable()
	if !ok {
		d := w.durationOf(w.cur)
		return "", &heldError{name: w.name, holder: holder, unseen: now.Sub(expiry.Add(-d)), duration: d}
	}
	stamp := metav1.NewMicroTime(w.clock.Now())
	if w.cur == nil {
		created, err := w.leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: w.name, Labels: w.labels, Annotations: w.annotations},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(w.holder),
				LeaseDurationSeconds: ptr.To(int32(w.duration / time.Second)),
				AcquireTime:          &stamp,
				RenewTime:            &stamp,
				LeaseTransitions:     ptr.To[int32](0),
			},
		}, metav1.CreateOptions{})
		if err != nil {
			return "", fmt.Errorf("creating Lease %s: %w", w.name, err)
		}
		w.cur = created
		return reason, nil
	}
	l := w.cur.DeepCopy()
	if holder != w.holder {
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
	l.Spec.HolderIdentity = ptr.To(w.holder)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(w.duration / time.Second))
	l.Spec.AcquireTime = &stamp
	l.Spec.RenewTime = &stamp
	return reason, w.update(ctx, l)
}

// renew writes a new renew time into the Lease this process holds. A
// conflict reads it again: it is renewed if it still names this process,
// and an error wrapping errLeaseLost says it does not.
func (w *leaseWriter) renew(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		if w.cur == nil {
			if err := w.read(ctx); err != nil {
				return err
			}
		}
		if w.cur == nil {
			return fmt.Errorf("%w: Lease %s was deleted", errLeaseLost, w.name)
		}
		if h := ptr.Deref(w.cur.Spec.HolderIdentity, ""); h != w.holder {
			return fmt.Errorf("%w: Lease %s is held by %q", errLeaseLost, w.name, h)
		}
		l := w.cur.DeepCopy()
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(w.clock.Now()))
		err := w.update(ctx, l)
		if err == nil || !apierrors.IsConflict(err) || attempt > 0 {
			return err
		}
	}
}

// renewBefore renews the Lease until it succeeds, retrying every retry,
// and gives up at deadline: the holder's last renewal plus its renew
// deadline, on the monotonic clock, which ends the holder's work lease
// duration − renew deadline before anyone else may take the Lease. It
// returns the local time taken before the write that succeeded, never later
// than the renew time others read, and an error wrapping errLeaseLost at
// once when the Lease names another holder.
func (w *leaseWriter) renewBefore(ctx context.Context, deadline time.Time, retry time.Duration) (time.Time, error) {
	var lastErr error
	for time.Now().Before(deadline) {
		now := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		err := w.renew(rctx)
		cancel()
		if err == nil {
			return now, nil
		}
		if errors.Is(err, errLeaseLost) {
			return time.Time{}, err
		}
		lastErr = err
		select {
		case <-time.After(min(retry, time.Until(deadline))):
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
	if lastErr == nil {
		// The deadline passed before a renewal could be tried: the process
		// was paused (GC, throttling, SIGSTOP) or starved.
		return time.Time{}, fmt.Errorf("renew deadline passed %s ago, before a renewal could be tried", time.Since(deadline).Round(time.Millisecond))
	}
	return time.Time{}, fmt.Errorf("renew deadline passed: %w", lastErr)
}

// release clears the holder of a Lease this process holds, so that the
// next holder need not wait for it to expire. Like client-go's leader
// election, it writes the release's time as acquire time too: from then on
// the Lease has had no holder (the handover gaps the end-to-end suite
// measures start there).
func (w *leaseWriter) release(ctx context.Context) error {
	if w.cur == nil || ptr.Deref(w.cur.Spec.HolderIdentity, "") != w.holder {
		return nil
	}
	return w.hand(ctx, "", time.Second, true)
}

// handOver writes another holder into the Lease this process holds, with a
// fresh renew time: the replica's name alone keeps it for its next
// incarnation, which takes it at once.
func (w *leaseWriter) handOver(ctx context.Context, to string) error {
	return w.hand(ctx, to, w.duration, false)
}

// hand writes holder to and duration into the Lease as last read or
// written, renewed now, and acquired now if acquired.
func (w *leaseWriter) hand(ctx context.Context, to string, duration time.Duration, acquired bool) error {
	if w.cur == nil {
		return nil
	}
	l := w.cur.DeepCopy()
	stamp := metav1.NewMicroTime(w.clock.Now())
	l.Spec.HolderIdentity = ptr.To(to)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(duration / time.Second))
	l.Spec.RenewTime = &stamp
	if acquired {
		l.Spec.AcquireTime = &stamp
	}
	return w.update(ctx, l)
}

// delete deletes the Lease, if it is still as this process last wrote it.
func (w *leaseWriter) delete(ctx context.Context) error {
	if w.cur == nil {
		return nil
	}
	err := w.leases.Delete(ctx, w.name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &w.cur.UID, ResourceVersion: &w.cur.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Lease %s: %w", w.name, err)
	}
	w.cur = nil
	return nil
}

// update writes l over the Lease last read or written, with this writer's
// labels and annotations. After a conflict, or if the Lease is gone, the
// next write reads it first.
func (w *leaseWriter) update(ctx context.Context, l *coordinationv1.Lease) error {
	if len(w.labels) > 0 {
		l.Labels = maps.Clone(l.Labels)
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		maps.Copy(l.Labels, w.labels)
	}
	if len(w.annotations) > 0 {
		l.Annotations = maps.Clone(l.Annotations)
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		for k, v := range w.annotations {
			if v == "" {
				// An annotation this writer says nothing of now.
				delete(l.Annotations, k)
			} else {
				l.Annotations[k] = v
			}
		}
	}
	updated, err := w.leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			w.cur = nil
		}
		return fmt.Errorf("writing Lease %s: %w", w.name, err)
	}
	w.cur = updated
	return nil
}

// newLeaseWriter writes the ring's Lease name as this replica.
func (e *env) newLeaseWriter(name string, labels, annotations map[string]string) *leaseWriter {
	return &leaseWriter{
		leases:      e.leases.CoordinationV1().Leases(e.opts.LeaseNamespace),
		name:        name,
		labels:      labels,
		annotations: annotations,
		holder:      e.holder,
		duration:    e.opts.LeaseDuration,
		clock:       e.opts.Clock,
		observed:    &e.observed,
	}
}
