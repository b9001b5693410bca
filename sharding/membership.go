package sharding

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kshard/kshard/sharding/lease"
)

// memberState is where this process is with its identity's member Lease.
type memberState int

const (
	// memberJoining: the member Lease has not been read or written yet.
	memberJoining memberState = iota
	// memberHeld: this incarnation holds the member Lease; the replica is
	// in the ring and may claim shards.
	memberHeld
	// memberWaiting: another process (another incarnation of this
	// identity) renews the member Lease; this one claims nothing and is not
	// ready until that Lease expires or is handed over.
	memberWaiting
)

func (st memberState) String() string { return [...]string{"Joining", "Held", "Waiting"}[st] }

// memberLease keeps this replica's member Lease fresh. Its presence, not any
// shard Lease, is what puts a replica in the ring; its holder,
// "<replica>_<incarnation>", is what keeps a second process with the same
// identity out.
type memberLease struct {
	env   *env
	lease *leaseWriter
	// wake tells the coordinator that the member state changed.
	wake func()
	// changed asks run for a write now: an annotation changed.
	changed chan struct{}

	mu     sync.Mutex
	state  memberState
	holder string // the other incarnation, while waiting
	// says are the annotations of a warm leave (Keys.Leaving,
	// Keys.WarmFor) the next write carries; "" clears one.
	says map[string]string
}

func newMemberLease(e *env, wake func()) *memberLease {
	opts := e.opts
	// Both start empty: a Lease taken over from an incarnation that was
	// leaving says so no more.
	says := map[string]string{e.keys.Leaving: "", e.keys.WarmFor: ""}
	return &memberLease{env: e, wake: wake, changed: make(chan struct{}, 1), says: says,
		lease: e.newLeaseWriter(lease.MemberName(opts.Ring, opts.Identity),
			map[string]string{e.keys.Ring: opts.Ring, e.keys.LeaseKind: lease.KindMember},
			map[string]string{e.keys.Shards: strconv.Itoa(int(opts.Shards))})}
}

// say sets an annotation of the member Lease, written at once.
func (m *memberLease) say(key, value string) {
	m.mu.Lock()
	same := m.says[key] == value
	m.says[key] = value
	m.mu.Unlock()
	if same {
		return
	}
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// run renews the member Lease every RetryPeriod until ctx is done. A renewal
// in flight when ctx ends finishes (within RenewDeadline) rather than being
// cancelled: a cancelled update may land without its answer being read,
// which left the Lease unknown, so the stopping replica's delete skipped the
// Lease and the others waited for it to expire instead of taking its shards
// at once (TestGracefulLeaveAndJoin, under load).
func (m *memberLease) run(ctx context.Context) {
	renewCtx := context.WithoutCancel(ctx)
	m.renewOnce(renewCtx)
	t := time.NewTicker(m.env.opts.RetryPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.renewOnce(renewCtx)
		case <-m.changed:
			m.renewOnce(renewCtx)
		}
	}
}

// setState moves to a state, logs the change and wakes the coordinator.
func (m *memberLease) setState(st memberState, other string) {
	m.mu.Lock()
	from := m.state
	m.state, m.holder = st, other
	m.mu.Unlock()
	if from == st {
		return
	}
	switch st {
	case memberWaiting:
		m.env.log.Info("REPLICA IDENTITY IN USE: another process renews this replica's member Lease; claiming nothing until it stops",
			"holder", other, "mine", m.env.holder)
	default:
		m.env.log.Info("Member Lease", "state", st, "holder", m.env.holder)
	}
	m.wake()
}

// held reports whether this incarnation holds the member Lease.
func (m *memberLease) held() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.state == memberHeld
}

// notHeldReason says why this incarnation does not hold the member Lease,
// nil when it does.
func (m *memberLease) notHeldReason() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.state {
	case memberHeld:
		return nil
	case memberWaiting:
		return fmt.Errorf("replica identity %q is in use by another process (member Lease holder %q, this process %q): waiting for it to stop renewing",
			m.env.opts.Identity, m.holder, m.env.holder)
	}
	return errors.New("member Lease not written yet")
}

// renewOnce creates, takes or renews the member Lease. It takes a Lease
// that is free, this incarnation's, kept for the next incarnation (holder
// without incarnation), or another incarnation's that this replica has not
// seen renewed for its duration; it waits on one that another incarnation
// still renews. Conflicts read it again.
func (m *memberLease) renewOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, m.env.opts.RenewDeadline)
	defer cancel()
	m.mu.Lock()
	maps.Copy(m.lease.annotations, m.says)
	m.mu.Unlock()
	for attempt := 0; attempt < 3; attempt++ {
		var err error
		if m.held() {
			err = m.lease.renew(ctx)
		} else {
			var reason string
			reason, err = m.lease.take(ctx)
			if reason == "expired" {
				m.env.log.Info("Took over this replica's member Lease from a process that stopped renewing it")
			}
		}
		var held *heldError
		switch {
		case err == nil:
			m.setState(memberHeld, "")
			return
		case errors.As(err, &held):
			m.setState(memberWaiting, held.holder)
			return
		case errors.Is(err, errLeaseLost):
			m.setState(memberJoining, "")
		case !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsNotFound(err):
			m.env.log.Error(err, "Renewing member Lease")
			return
		}
	}
}

// handOver renews the member Lease once more in the name of the replica,
// without this process's incarnation: the ring keeps the replica while it
// restarts, and its next incarnation takes the Lease at once.
func (m *memberLease) handOver(ctx context.Context) {
	if !m.held() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.env.opts.RenewDeadline)
	defer cancel()
	if err := m.lease.handOver(ctx, m.env.opts.Identity); err != nil {
		m.env.log.Error(err, "Handing the member Lease over to the next incarnation; it waits for the Lease to expire")
	}
}

// delete removes the member Lease, if this incarnation still holds it: the
// replica leaves the ring.
func (m *memberLease) delete(ctx context.Context) {
	if !m.held() {
		return
	}
	if err := m.lease.delete(ctx); err != nil {
		m.env.log.Error(err, "Deleting member Lease; the ring drops this replica when it expires")
	}
}
