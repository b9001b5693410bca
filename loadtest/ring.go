package loadtest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
)

// Where the load tester's replicas coordinate. They differ from the
// defaults of `kshard controller`, so a run against an existing cluster does
// not join a ring running there.
const (
	LeaseNamespace = "kshard-loadtest"
	Ring           = "loadtest"
	// StatefulSet is the inert StatefulSet object the replicas consult to
	// tell a restart from a scale-down, as in a cluster; nothing runs its
	// pods (the control plane has no controller manager). Replica i is
	// "<StatefulSet>-<i>".
	StatefulSet = "kshard"
)

// ringPoll is how often the ring watcher evaluates ownership: the
// resolution of unowned intervals and of the ownership chart.
const ringPoll = 100 * time.Millisecond

// ringWatch follows the ring's Leases and judges ownership the way it
// matters to objects: a shard is owned while its Lease has a holder, has not
// expired, and was renewed by the holder's running process (not by an
// earlier process of the same replica). A SIGKILLed replica's Leases look
// held until they expire; its shards are unowned from the kill until a
// running process takes them, its own restart included.
type ringWatch struct {
	// running tells whether a replica's process runs, and since when.
	running func(id string) (time.Time, bool)

	mu      sync.Mutex
	shards  map[int32]shardLease
	members map[string]memberLease

	// guard turns the unowned-interval check on: off while a fleet starts
	// or stops as a whole, when nothing is supposed to own the shards.
	guard        bool
	unownedSince map[int32]time.Time
	intervals    []unownedInterval
	// ownership is the shards owned per replica (and "unowned") over time,
	// one point per change.
	ownership []ownershipPoint
	lastCount map[string]int
	// holderHistory is each shard's running holder over time, one entry per
	// change seen by a tick ("" while unowned), so an event's holders
	// before it can be read after the fact: a signal's sender does not wait
	// for a snapshot, and a SIGTERMed replica's Leases are released by the
	// time terminate returns.
	holderHistory map[int32][]holderChange
}

// holderChange is a shard's running holder from At on.
type holderChange struct {
	At     time.Time
	Holder string
}

type shardLease struct {
	holder         string
	acquire, renew time.Time
	duration       time.Duration
}

func (l shardLease) live(now time.Time) bool {
	return l.holder != "" && now.Before(l.renew.Add(l.duration))
}

type memberLease = shardLease

// unownedInterval is a time a shard had no running holder while guarded.
type unownedInterval struct {
	Shard    int32
	From, To time.Time
}

type ownershipPoint struct {
	At    time.Time
	Count map[string]int
}

// unowned is the pseudo-holder of unowned shards in ownership points.
const unowned = "<unowned>"

func newRingWatch(ctx context.Context, cfg *rest.Config, running func(string) (time.Time, bool)) (*ringWatch, error) {
	w := &ringWatch{running: running, shards: map[int32]shardLease{}, members: map[string]memberLease{}, unownedSince: map[int32]time.Time{},
		holderHistory: map[int32][]holderChange{}}
	c, err := cache.New(cfg, cache.Options{
		Scheme:            replica.Scheme(),
		DefaultNamespaces: map[string]cache.Config{LeaseNamespace: {}},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the Lease watch: %w", err)
	}
	inf, err := c.GetInformer(ctx, &coordinationv1.Lease{})
	if err != nil {
		return nil, fmt.Errorf("creating the Lease watch: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj, false) },
		UpdateFunc: func(_, obj any) { w.observe(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			w.observe(obj, true)
		},
	}); err != nil {
		return nil, fmt.Errorf("watching Leases: %w", err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the Lease watch did not sync: %w", context.Cause(ctx))
	}
	go w.loop(ctx)
	return w, nil
}

func (w *ringWatch) observe(obj any, deleted bool) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || l.Labels[sharding.LabelRing] != Ring {
		return
	}
	st := shardLease{holder: sharding.HolderReplica(ptr.Deref(l.Spec.HolderIdentity, ""))}
	if l.Spec.AcquireTime != nil {
		st.acquire = l.Spec.AcquireTime.Time
	}
	if l.Spec.RenewTime != nil {
		st.renew = l.Spec.RenewTime.Time
	}
	st.duration = time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	if deleted {
		st = shardLease{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch l.Labels[sharding.LabelLeaseKind] {
	case sharding.LeaseKindMember:
		name, ok := sharding.ParseMemberLeaseName(Ring, l.Name)
		if !ok {
			return
		}
		if deleted {
			delete(w.members, name)
		} else {
			w.members[name] = st
		}
	case sharding.LeaseKindShard:
		n, ok := sharding.ParseShardLeaseName(Ring, l.Name, sharding.DefaultShards)
		if !ok {
			return
		}
		w.shards[n] = st
	}
}

func (w *ringWatch) loop(ctx context.Context) {
	t := time.NewTicker(ringPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			w.tick(now)
		}
	}
}

// owner is a shard's running holder, "" when it has none.
func (w *ringWatch) owner(n int32, now time.Time) string {
	l, ok := w.shards[n]
	if !ok || !w.heldByRunning(l, now) {
		return ""
	}
	return l.holder
}

// heldByRunning says whether a Lease is live and was last renewed by its
// holder's current process.
func (w *ringWatch) heldByRunning(l shardLease, now time.Time) bool {
	if !l.live(now) {
		return false
	}
	since, ok := w.running(l.holder)
	return ok && !l.renew.Before(since)
}

func (w *ringWatch) tick(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	count := map[string]int{}
	for n := range sharding.DefaultShards {
		h := w.owner(n, now)
		if h == "" {
			count[unowned]++
		} else {
			count[h]++
		}
		if hist := w.holderHistory[n]; len(hist) == 0 || hist[len(hist)-1].Holder != h {
			w.holderHistory[n] = append(hist, holderChange{At: now, Holder: h})
		}
		if !w.guard {
			continue
		}
		since, open := w.unownedSince[n]
		switch {
		case h == "" && !open:
			w.unownedSince[n] = now
		case h != "" && open:
			w.intervals = append(w.intervals, unownedInterval{Shard: n, From: since, To: now})
			delete(w.unownedSince, n)
		}
	}
	if !sameCounts(count, w.lastCount) {
		w.ownership = append(w.ownership, ownershipPoint{At: now, Count: count})
		w.lastCount = count
	}
}

func sameCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// setGuard turns the unowned check on or off. Turning it off closes the
// open intervals at that moment.
func (w *ringWatch) setGuard(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.guard == on {
		return
	}
	now := time.Now()
	if !on {
		for n, since := range w.unownedSince {
			w.intervals = append(w.intervals, unownedInterval{Shard: n, From: since, To: now})
		}
	}
	w.unownedSince = map[int32]time.Time{}
	w.guard = on
}

// longestUnowned returns the guarded unowned intervals so far, the open ones
// counted until now, longest first.
func (w *ringWatch) unownedIntervals() []unownedInterval {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := append([]unownedInterval(nil), w.intervals...)
	now := time.Now()
	for n, since := range w.unownedSince {
		out = append(out, unownedInterval{Shard: n, From: since, To: now})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].To.Sub(out[i].From) > out[j].To.Sub(out[j].From) })
	return out
}

// holdersAt returns each shard's running holder as the last tick at or
// before t saw it; shards without one are absent.
func (w *ringWatch) holdersAt(t time.Time) map[int32]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[int32]string{}
	for n, hist := range w.holderHistory {
		h := ""
		for _, c := range hist {
			if c.At.After(t) {
				break
			}
			h = c.Holder
		}
		if h != "" {
			out[n] = h
		}
	}
	return out
}

// holdersNow returns each shard's running holder now; shards without one
// are absent.
func (w *ringWatch) holdersNow(now time.Time) map[int32]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[int32]string{}
	for n := range sharding.DefaultShards {
		if h := w.owner(n, now); h != "" {
			out[n] = h
		}
	}
	return out
}

// movedToOther counts the shards that had a running holder before an event
// and have a different running holder after it: the shards the event gave to
// another replica. A shard unowned after (a settle that timed out) has not
// moved anywhere yet and is not counted, nor is one unowned before (a
// fleet's start). A rolling restart's goal is 0: the restarted replica keeps
// its ring membership and takes its own shards back.
func movedToOther(before, after map[int32]string) int {
	n := 0
	for shard, was := range before {
		if now := after[shard]; was != "" && now != "" && now != was {
			n++
		}
	}
	return n
}

// ownershipSeries returns the ownership points so far.
func (w *ringWatch) ownershipSeries() []ownershipPoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ownershipPoint(nil), w.ownership...)
}

// balance says whether every running replica is a live ring member and
// every shard is owned by the replica the ring built from them assigns it,
// and lists the shards acquired at or after since with their holders (the
// shards that moved, or were re-acquired, since an event). detail says what
// is missing.
func (w *ringWatch) balance(now, since time.Time, running []string) (ok bool, detail string, moved map[int32]movedShard) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var members []string
	for name, l := range w.members {
		if w.heldByRunning(l, now) {
			members = append(members, name)
		}
	}
	for _, id := range running {
		if !slices.Contains(members, id) {
			return false, id + " runs but is not a live ring member yet", nil
		}
	}
	if len(members) == 0 {
		return false, "no running live member", nil
	}
	ring := sharding.NewRing(sharding.DefaultShards, members)
	moved = map[int32]movedShard{}
	var unownedShards, wrong []int32
	for n := range sharding.DefaultShards {
		h := w.owner(n, now)
		switch {
		case h == "":
			unownedShards = append(unownedShards, n)
		case h != ring.Owner(n):
			wrong = append(wrong, n)
		}
		if l := w.shards[n]; h != "" && !l.acquire.Before(since) {
			moved[n] = movedShard{holder: h, acquired: l.acquire}
		}
	}
	switch {
	case len(unownedShards) > 0:
		return false, fmt.Sprintf("%d shards without a running holder (e.g. %d)", len(unownedShards), unownedShards[0]), moved
	case len(wrong) > 0:
		n := wrong[0]
		return false, fmt.Sprintf("%d shards not yet with their desired owner (e.g. %d: %s, desired %s)", len(wrong), n, w.shards[n].holder, ring.Owner(n)), moved
	}
	return true, "", moved
}

type movedShard struct {
	holder   string
	acquired time.Time
}
