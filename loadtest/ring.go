package loadtest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
	"github.com/kshard/kshard/sharding/ring"
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
// resolution of unowned intervals.
const ringPoll = 100 * time.Millisecond

// ringWatch follows the ring's Leases and judges ownership the way it
// matters to objects: a shard is owned while its Lease has a holder, has not
// expired, and the process holding it as its holder identity (not an earlier
// process of the same replica) runs. A SIGKILLed replica's Leases look held
// until they expire; its shards are unowned from the kill until a running
// process takes them, its own restart included.
//
// Times written into Leases are the writer's wall clock, which the chaos
// scenario's clock fault shifts (--lease-clock-offset); the watch knows each
// process's offset and subtracts it, so every time it keeps is the machine's
// clock, the one the audit logs and the load tester use.
type ringWatch struct {
	// ring names the ring whose Leases it follows, of count shards.
	ring  string
	count int32
	// processOf finds the newest process of a replica started at or before
	// a time: the process behind a holder identity first seen then.
	processOf func(replica string, at time.Time) *instance
	// byHolder, when set, finds the process behind a holder identity from
	// what the process said (a pod's log), nil until it did. Until then,
	// processOf answers, and the answer is not kept: a container is known
	// from its pod's status, which may arrive after its first Lease write.
	byHolder func(holder string) *instance

	mu      sync.Mutex
	shards  map[int32]shardLease
	members map[string]memberLease
	// writers maps each holder identity ("<replica>_<incarnation>") to its
	// process, from the identity's first sighting: a process draws a new
	// incarnation, so its first Lease write names an identity never seen,
	// and the replica's newest process wrote it.
	writers map[string]*instance
	// lastHolder is each Lease's (by name) last holder identity with an
	// incarnation: the writer of a version without one, a release (holder
	// "") or a member Lease kept for the replica's next incarnation.
	lastHolder map[string]string
	// version is each Lease's (by name) resourceVersion as last taken in,
	// from the watch or a poll: a poll's answer older than what the watch
	// delivered meanwhile is not taken.
	version map[string]uint64
	// list reads the ring's Leases from the API server directly, past the
	// watch: see poll.
	list func(context.Context) ([]coordinationv1.Lease, error)
	// watched is when the watch last delivered a Lease of the ring: a
	// stopped poll ends only once it delivers again.
	watched time.Time

	// guard turns the unowned-interval check on: off while a fleet starts
	// or stops as a whole, when nothing is supposed to own the shards.
	guard bool
	// guarded counts the ticks with the guard on: the checks of every
	// shard's ownership the unowned check rests on.
	guarded      int
	unownedSince map[int32]time.Time
	intervals    []unownedInterval
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

// shardLease is a Lease as last seen. Its times are on the machine's clock
// (the writer's clock offset subtracted).
type shardLease struct {
	// holder is the replica holding it, "" when released.
	holder string
	// proc is the process holding it as its holder identity; nil when no
	// process does (released, kept for the next incarnation) or the writer
	// is unknown.
	proc           *instance
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

// newRingWatch follows the Leases of ring in namespace ns.
func newRingWatch(ctx context.Context, cfg *rest.Config, ns, ring string, count int32, processOf func(string, time.Time) *instance, byHolder func(string) *instance) (*ringWatch, error) {
	w := newRingState(ring, count, processOf)
	w.byHolder = byHolder
	c, err := cache.New(cfg, cache.Options{
		Scheme:            replica.Scheme(),
		DefaultNamespaces: map[string]cache.Config{ns: {}},
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
	direct, err := client.New(cfg, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("creating the Lease poll: %w", err)
	}
	w.list = func(ctx context.Context) ([]coordinationv1.Lease, error) {
		var l coordinationv1.LeaseList
		if err := direct.List(ctx, &l, client.InNamespace(ns), client.MatchingLabels{sharding.LabelRing: ring}); err != nil {
			return nil, fmt.Errorf("listing the ring's Leases: %w", err)
		}
		return l.Items, nil
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the Lease watch did not sync: %w", context.Cause(ctx))
	}
	go w.loop(ctx)
	return w, nil
}

// newRingState is a ring watch with nothing seen yet, not watching.
func newRingState(ring string, count int32, processOf func(string, time.Time) *instance) *ringWatch {
	return &ringWatch{ring: ring, count: count, processOf: processOf, shards: map[int32]shardLease{}, members: map[string]memberLease{}, unownedSince: map[int32]time.Time{},
		holderHistory: map[int32][]holderChange{}, writers: map[string]*instance{}, lastHolder: map[string]string{}, version: map[string]uint64{}}
}

// hasIncarnation says whether a holder identity names a process
// ("<replica>_<incarnation>"), not only a replica.
func hasIncarnation(holder string) bool {
	return holder != "" && lease.HolderReplica(holder) != holder
}

// writer is the process behind a holder identity, nil if unknown. Caller
// holds w.mu.
func (w *ringWatch) writer(holder string, seen time.Time) *instance {
	if !hasIncarnation(holder) {
		return nil
	}
	if in, ok := w.writers[holder]; ok {
		return in
	}
	if w.byHolder != nil {
		if in := w.byHolder(holder); in != nil {
			w.writers[holder] = in
			return in
		}
		return w.processOf(lease.HolderReplica(holder), seen)
	}
	in := w.processOf(lease.HolderReplica(holder), seen)
	if in != nil {
		w.writers[holder] = in
	}
	return in
}

func (w *ringWatch) observe(obj any, deleted bool) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || l.Labels[sharding.LabelRing] != w.ring {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watched = time.Now()
	if w.newer(l) {
		w.record(l, deleted, w.watched)
	}
}

// newer says whether l is a later version of its Lease than the one taken
// in, and notes its version. Caller holds w.mu.
func (w *ringWatch) newer(l *coordinationv1.Lease) bool {
	v, err := strconv.ParseUint(l.ResourceVersion, 10, 64)
	if err != nil {
		return true
	}
	if v < w.version[l.Name] {
		return false
	}
	w.version[l.Name] = v
	return true
}

// poll reads the ring's Leases from the API server every ringPoll × 5,
// beside the watch, until the returned stop is called and the watch has
// delivered a Lease since. An API server restart breaks the load tester's
// watch as it breaks the replicas': client-go reconnects it with a backoff
// that an outage grows to 30–60 s, while the replicas renew their Leases by
// direct requests as soon as the server answers. Without the poll, a shard
// held again at once would look unowned until the watch came back; and a
// poll that ended with the restart's handover, before the watch was back,
// left every Lease looking expired from then on (chaos at 7166159: all 64
// shards unowned for more than lease duration + retry period after the
// restart had settled). The Leases are renewed every retry period, so a
// watch that is back delivers within one. A failed read (the server away)
// is retried at the next poll. stop does not wait, and may be called again.
func (w *ringWatch) poll(ctx context.Context) (stop func()) {
	stopping := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * ringPoll)
		defer t.Stop()
		asked := stopping
		var stopAt time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-asked:
				stopAt, asked = time.Now(), nil
				continue
			case <-t.C:
			}
			w.mu.Lock()
			back := !stopAt.IsZero() && w.watched.After(stopAt)
			w.mu.Unlock()
			if back {
				return
			}
			leases, err := w.list(ctx)
			if err != nil {
				continue
			}
			w.mu.Lock()
			now := time.Now()
			for i := range leases {
				if w.newer(&leases[i]) {
					w.record(&leases[i], false, now)
				}
			}
			w.mu.Unlock()
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(stopping) }) }
}

// record takes in a Lease seen at seen. Caller holds w.mu.
func (w *ringWatch) record(l *coordinationv1.Lease, deleted bool, seen time.Time) {
	identity := ptr.Deref(l.Spec.HolderIdentity, "")
	// A version is written by its holder, or, without one that names a
	// process, by the previous holder (releasing, or keeping the member
	// Lease for its next incarnation).
	wrote := identity
	if hasIncarnation(identity) {
		w.lastHolder[l.Name] = identity
	} else {
		wrote = w.lastHolder[l.Name]
	}
	var offset time.Duration
	if in := w.writer(wrote, seen); in != nil {
		offset = in.clockOffset
	}
	st := shardLease{holder: lease.HolderReplica(identity)}
	if hasIncarnation(identity) {
		st.proc = w.writer(identity, seen)
	}
	if l.Spec.AcquireTime != nil {
		st.acquire = l.Spec.AcquireTime.Add(-offset)
	}
	if l.Spec.RenewTime != nil {
		st.renew = l.Spec.RenewTime.Add(-offset)
	}
	st.duration = time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	if deleted {
		st = shardLease{acquire: seen}
	}
	switch l.Labels[sharding.LabelLeaseKind] {
	case lease.KindMember:
		name, ok := lease.ParseMemberName(w.ring, l.Name)
		if !ok {
			return
		}
		if deleted {
			delete(w.members, name)
		} else {
			w.members[name] = st
		}
	case lease.KindShard:
		n, ok := lease.ParseShardName(w.ring, l.Name, w.count)
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

// heldByRunning says whether a Lease is live and the process holding it
// runs (a paused one included: its Leases expire by themselves).
func (w *ringWatch) heldByRunning(l shardLease, now time.Time) bool {
	return l.live(now) && l.proc != nil && l.proc.proc.Running()
}

func (w *ringWatch) tick(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.guard {
		w.guarded++
	}
	for n := range w.count {
		h := w.owner(n, now)
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

// guardedTicks is the number of ticks that checked ownership with the
// guard on.
func (w *ringWatch) guardedTicks() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.guarded
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
	for n := range w.count {
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
	ringName := ring.New(w.count, members)
	moved = map[int32]movedShard{}
	var unownedShards, wrong []int32
	for n := range w.count {
		h := w.owner(n, now)
		switch {
		case h == "":
			unownedShards = append(unownedShards, n)
		case h != ringName.Owner(n):
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
		return false, fmt.Sprintf("%d shards not yet with their desired owner (e.g. %d: %s, desired %s)", len(wrong), n, w.shards[n].holder, ringName.Owner(n)), moved
	}
	return true, "", moved
}

type movedShard struct {
	holder   string
	acquired time.Time
}
