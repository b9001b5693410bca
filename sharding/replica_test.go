package sharding_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
	"github.com/kshard/kshard/sharding/ring"
)

// shards is the shard count of most tests' rings: a quarter of the default.
// Every held shard Lease is renewed once per RetryPeriod, so the count sets
// how busy the API server and the replicas are while a test waits (most of
// the package's CPU time); what those tests check (handover, fencing, no
// overlap) holds for any count, and 16 still gives each of three replicas
// four to six shards.
const shards = 16

// fullShards is the default count, for the rings of the tests whose
// assertions are about the count itself: how evenly the ring splits it,
// how much a replica may claim while starting, how many caches a fleet
// syncs per shard moved: sharding.DefaultShards, untyped.
const fullShards = 64

// fullRings are the rings that run with fullShards.
var fullRings = map[string]bool{"split": true, "startup": true, "lists": true, "measure": true}

// shardsOf is the shard count of a ring.
func shardsOf(ring string) int32 {
	if fullRings[ring] {
		return fullShards
	}
	return shards
}

func ringConfig(ns, ring, id string) replicaConfig {
	return replicaConfig{id: id, namespace: ns, ring: ring, shards: shardsOf(ring), timing: fastTiming}
}

// expectRingHeld waits until every shard is held, by the owner the ring of
// the given members names.
func expectRingHeld(t *testing.T, c client.Client, ns, ringName string, members []string) {
	t.Helper()
	want := ring.New(shardsOf(ringName), members)
	controlplane.Eventually(t, 2*time.Minute, "every shard held by its ring owner", func() error {
		leases := shardHolders(t, c, ns, ringName)
		now := time.Now()
		for n := range shardsOf(ringName) {
			l, ok := leases[n]
			if !ok || holderOf(l) != want.Owner(n) || !leaseExpiry(l).After(now) {
				return fmt.Errorf("shard %d held by %q, ring owner %q", n, holderOf(l), want.Owner(n))
			}
		}
		return nil
	})
}

// leaseHistory watches a ring's shard Leases and records every holder change,
// to check that no shard is ever taken from a live holder.
type leaseHistory struct {
	mu        sync.Mutex
	last      map[string]coordinationv1.Lease
	violation []string
	// seen is when each Lease's last version arrived, on the test's clock;
	// fromLive lists the Leases another holder took less than half a
	// lease duration (fastTiming) after their holder's last write arrived:
	// taken from a live holder, whatever the clocks written into them say.
	// A takeover after an expiry waits a whole lease duration from the
	// last write the taker saw.
	seen     map[string]time.Time
	fromLive []string
}

func watchLeases(t *testing.T, ns, ring string) *leaseHistory {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	w, err := cs.CoordinationV1().Leases(ns).Watch(context.Background(), metav1.ListOptions{
		LabelSelector: sharding.LabelRing + "=" + ring + "," + sharding.LabelLeaseKind + "=" + lease.KindShard,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &leaseHistory{last: map[string]coordinationv1.Lease{}, seen: map[string]time.Time{}}
	go func() {
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			h.observe(*l)
		}
	}()
	t.Cleanup(w.Stop)
	return h
}

func (h *leaseHistory) observe(l coordinationv1.Lease) {
	h.mu.Lock()
	defer h.mu.Unlock()
	prev, seen := h.last[l.Name]
	h.last[l.Name] = l
	now, prevAt := time.Now(), h.seen[l.Name]
	h.seen[l.Name] = now
	if !seen || holderIdentity(l) == "" || holderIdentity(prev) == "" || holderIdentity(prev) == holderIdentity(l) {
		return
	}
	if gap := now.Sub(prevAt); gap < fastTiming.lease/2 {
		h.fromLive = append(h.fromLive, fmt.Sprintf("%s taken by %s %s after %s's last write", l.Name, holderIdentity(l), gap.Round(time.Millisecond), holderIdentity(prev)))
	}
	// Taken straight from another holder: only allowed once that holder's
	// Lease had expired.
	if l.Spec.AcquireTime == nil || l.Spec.AcquireTime.Time.Before(leaseExpiry(prev)) {
		h.violation = append(h.violation, fmt.Sprintf("%s taken by %s at %v while %s held it until %v",
			l.Name, holderIdentity(l), l.Spec.AcquireTime, holderIdentity(prev), leaseExpiry(prev)))
	}
}

func (h *leaseHistory) check(t *testing.T) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, v := range h.violation {
		t.Error(v)
	}
}

// TestThreeReplicasSplitTheRing: every shard is held by exactly the replica
// the ring names, loads are balanced, and each replica's caches hold only its
// own shards' objects.
//
// It runs alone (not parallel): kshard status counts the ConfigBindings of
// every namespace, and another test's would be counted. Alone, its replicas
// watch every namespace, as a controller deployed without --namespaces
// does.
func TestThreeReplicasSplitTheRing(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t, c)
	ringName := "split"
	keys := createBindings(t, c, ns, 300, 60)
	ids := []string{"r-0", "r-1", "r-2"}
	var reps []*replica
	for _, id := range ids {
		rc := ringConfig(ns, ringName, id)
		rc.everyNamespace = true
		reps = append(reps, startReplica(t, rc))
	}
	expectRingHeld(t, c, ns, ringName, ids)
	controlplane.Eventually(t, 3*time.Minute, "all objects reconciled by their shard's holder", func() error { return allReconciled(c, ns, ringName, t) })

	total, maxHeld := 0, 0
	for _, r := range reps {
		held := r.rep.HeldShards()
		total += len(held)
		maxHeld = max(maxHeld, len(held))
		controlplane.Eventually(t, time.Minute, "replica ready", r.rep.Ready)
	}
	if total != fullShards {
		t.Fatalf("replicas hold %d shards in all, want %d", total, fullShards)
	}
	if ratio := float64(maxHeld) / (float64(fullShards) / 3); ratio > 1.25 {
		t.Fatalf("max/mean shards per replica = %.2f, want <= 1.25", ratio)
	}

	// Each replica can read exactly the objects of the shards it holds.
	seen := map[client.ObjectKey]string{}
	for _, r := range reps {
		for _, n := range r.rep.HeldShards() {
			reader, ok := r.rep.Reader(n)
			if !ok {
				t.Fatalf("%s holds shard %d but has no reader", r.id, n)
			}
			var list configv1alpha1.ConfigBindingList
			if err := reader.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			for _, cb := range list.Items {
				if got, _ := ring.KeysFor(sharding.DefaultLabelPrefix).ShardLabel(cb.Labels, fullShards); got != n {
					t.Errorf("%s: shard %d cache holds %s of shard %d", r.id, n, cb.Name, got)
				}
				if prev, dup := seen[client.ObjectKeyFromObject(&cb)]; dup {
					t.Errorf("%s cached by %s and %s", cb.Name, prev, r.id)
				}
				seen[client.ObjectKeyFromObject(&cb)] = r.id
			}
		}
	}
	if len(seen) != len(keys) {
		t.Fatalf("replicas cache %d objects in all, want %d", len(seen), len(keys))
	}

	// The metrics say the same. The three in-process replicas share one
	// registry: per-replica gauges add up to the ring's totals, and the
	// ring-wide ones (members, unowned) are set alike by each.
	controlplane.Eventually(t, time.Minute, "sharding metrics", func() error {
		want := map[string]float64{"kshard_shards_owned": fullShards, "kshard_ring_members": 3, "kshard_unowned_shards": 0,
			"kshard_shard_objects": float64(len(keys)), "kshard_ring_shard_count_mismatch": 0}
		for name, v := range want {
			got, err := gathered(name, ringName)
			if err != nil {
				return err
			}
			if got != v {
				return fmt.Errorf("%s = %v, want %v", name, got, v)
			}
		}
		return nil
	})

	// kshard status reads the same picture from the cluster.
	st, err := ring.ReadStatus(context.Background(), c, ring.StatusOptions{Namespace: ns, Ring: ringName, Kind: configv1alpha1.GroupVersion.WithKind("ConfigBinding"), LabelPrefix: sharding.DefaultLabelPrefix})
	if err != nil {
		t.Fatal(err)
	}
	if st.ShardCount != fullShards || len(st.Unowned) != 0 || len(st.Members) != 3 || st.Unlabeled != 0 {
		t.Fatalf("status: %d shards, unowned %v, %d members, %d unlabeled", st.ShardCount, st.Unowned, len(st.Members), st.Unlabeled)
	}
	objects := 0
	for _, s := range st.Shards {
		objects += s.Objects
		if s.Holder != s.Desired {
			t.Errorf("status: shard %d held by %q, desired %q", s.Shard, s.Holder, s.Desired)
		}
	}
	if objects != len(keys) {
		t.Fatalf("status counts %d objects, want %d", objects, len(keys))
	}
	if len(st.Unowned) != 0 {
		t.Fatalf("status: unowned shards %v", st.Unowned)
	}

	// Stopping every replica leaves every shard unowned, and status says so.
	for _, r := range reps {
		r.stop(t)
	}
	st, err = ring.ReadStatus(context.Background(), c, ring.StatusOptions{Namespace: ns, Ring: ringName, Kind: configv1alpha1.GroupVersion.WithKind("ConfigBinding"), LabelPrefix: sharding.DefaultLabelPrefix})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Unowned) != fullShards {
		t.Fatalf("after stopping every replica, %d shards unowned, want %d", len(st.Unowned), fullShards)
	}
}

// TestGracefulLeaveAndJoin: a replica that stops hands its shards over
// before its Leases could have expired; a joining replica takes its share;
// no shard Lease is ever taken from a live holder.
func TestGracefulLeaveAndJoin(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "leave-join"
	createBindings(t, c, ns, 200, 50)
	history := watchLeases(t, ns, ring)
	// Long leases: a handover that waited for expiry would be plain to see.
	slow := timing{lease: 60 * time.Second, renew: 40 * time.Second, retry: 2 * time.Second}
	reps := map[string]*replica{}
	for _, id := range []string{"r-0", "r-1", "r-2"} {
		rc := ringConfig(ns, ring, id)
		rc.timing = slow
		reps[id] = startReplica(t, rc)
	}
	expectRingHeld(t, c, ns, ring, []string{"r-0", "r-1", "r-2"})

	before := shardHolders(t, c, ns, ring)
	reps["r-2"].stop(t)
	stopped := time.Now()
	expectRingHeld(t, c, ns, ring, []string{"r-0", "r-1"})
	after := shardHolders(t, c, ns, ring)
	for n, l := range before {
		if holderOf(l) != "r-2" {
			continue
		}
		got := after[n]
		// The old holder's Lease would have expired at leaseExpiry(l) (or
		// later: it kept renewing until it stopped). The new holder took it
		// before that: the handover did not wait for expiry.
		if !got.Spec.AcquireTime.Time.Before(leaseExpiry(l)) || !got.Spec.AcquireTime.Time.Before(stopped.Add(slow.lease)) {
			t.Errorf("shard %d: acquired by %s at %v, old Lease expired at %v", n, holderOf(got), got.Spec.AcquireTime, leaseExpiry(l))
		}
	}
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled after leave", func() error { return allReconciled(c, ns, ring, t) })

	rc := ringConfig(ns, ring, "r-3")
	rc.timing = slow
	reps["r-3"] = startReplica(t, rc)
	expectRingHeld(t, c, ns, ring, []string{"r-0", "r-1", "r-3"})
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled after join", func() error { return allReconciled(c, ns, ring, t) })
	history.check(t)
}

// TestCrashFailover: the shards of a replica killed with SIGKILL stay
// unheld until their Leases expire, then the survivors take them.
func TestCrashFailover(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "crash"
	createBindings(t, c, ns, 200, 50)
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	procs := map[string]*replicaProcess{}
	for _, id := range []string{"p-0", "p-1", "p-2"} {
		procs[id] = startReplicaProcess(t, id, ns, ring, fastTiming, audit)
	}
	expectRingHeld(t, c, ns, ring, []string{"p-0", "p-1", "p-2"})
	history := watchLeases(t, ns, ring)

	killedAt := procs["p-1"].kill(t)
	before := shardHolders(t, c, ns, ring)
	expectRingHeld(t, c, ns, ring, []string{"p-0", "p-2"})
	after := shardHolders(t, c, ns, ring)
	moved := 0
	for n, l := range before {
		if holderOf(l) != "p-1" {
			continue
		}
		moved++
		if got := after[n]; got.Spec.AcquireTime.Time.Before(leaseExpiry(l)) {
			t.Errorf("shard %d of the killed replica acquired by %s at %v, before its Lease expired at %v",
				n, holderOf(got), got.Spec.AcquireTime, leaseExpiry(l))
		}
	}
	if moved == 0 {
		t.Fatal("the killed replica held no shard")
	}
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled after crash", func() error { return allReconciled(c, ns, ring, t) })
	history.check(t)
	if o := overlaps(readAudit(t, map[string]time.Time{"p-1": killedAt}, audit)); len(o) > 0 {
		t.Fatalf("overlapping reconciles:\n%v", o)
	}
}

// TestNoOverlappingReconciles: through join, graceful leave, crash and
// rejoin under continuous spec updates, no two replicas ever reconcile one
// object at the same time, and every object's latest generation is
// reconciled.
func TestNoOverlappingReconciles(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "overlap"
	keys := createBindings(t, c, ns, 150, 40)
	dir := t.TempDir()
	auditOf := func(id string) string { return filepath.Join(dir, id+".jsonl") }
	procs := map[string]*replicaProcess{}
	start := func(id string) { procs[id] = startReplicaProcess(t, id, ns, ring, fastTiming, auditOf(id)) }
	start("p-0")
	start("p-1")
	expectRingHeld(t, c, ns, ring, []string{"p-0", "p-1"})

	stopUpdates := updateContinuously(t, c, keys)

	killed := map[string]time.Time{}
	start("p-2") // join
	expectRingHeld(t, c, ns, ring, []string{"p-0", "p-1", "p-2"})
	if err := procs["p-0"].cmd.Process.Signal(os.Interrupt); err != nil { // graceful leave
		t.Fatal(err)
	}
	_ = procs["p-0"].cmd.Wait()
	expectRingHeld(t, c, ns, ring, []string{"p-1", "p-2"})
	killed["p-1"] = procs["p-1"].kill(t) // crash
	expectRingHeld(t, c, ns, ring, []string{"p-2"})
	start("p-0") // rejoin
	expectRingHeld(t, c, ns, ring, []string{"p-0", "p-2"})
	t.Logf("%d spec updates during the run", stopUpdates())

	controlplane.Eventually(t, 2*time.Minute, "latest generation of every object reconciled", func() error { return allReconciled(c, ns, ring, t) })
	var paths []string
	for _, id := range []string{"p-0", "p-1", "p-2"} {
		paths = append(paths, auditOf(id))
	}
	byObject := readAudit(t, killed, paths...)
	if len(byObject) == 0 {
		t.Fatal("the audit log is empty")
	}
	if o := overlaps(byObject); len(o) > 0 {
		t.Fatalf("%d overlapping reconciles, e.g.:\n%v", len(o), o[:min(len(o), 5)])
	}
}

// TestFencing: a replica whose API traffic is cut stops its shards before
// its Leases expire, so nobody else can start them while it still runs.
func TestFencing(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "fencing"
	createBindings(t, c, ns, 100, 30)
	proxy := newCutProxy(t, cp.Config.Host)
	cfg := rest.CopyConfig(cp.Config)
	cfg.Host = "https://" + proxy.addr()
	rc := ringConfig(ns, ring, "fenced")
	rc.restConfig = cfg
	rc.tenures = &tenureLog{}
	// A wide gap between the renew deadline and the lease duration, so the
	// check below is about order, not about a loaded machine's speed.
	rc.timing = timing{lease: 20 * time.Second, renew: 4 * time.Second, retry: time.Second}
	r := startReplica(t, rc)
	expectRingHeld(t, c, ns, ring, []string{"fenced"})
	controlplane.Eventually(t, time.Minute, "replica ready", r.rep.Ready)

	leases := shardHolders(t, c, ns, ring)
	proxy.cut()
	controlplane.Eventually(t, time.Minute, "replica stopped its shards", func() error {
		if held := r.rep.HeldShards(); len(held) > 0 {
			return fmt.Errorf("still runs %d shards", len(held))
		}
		return nil
	})
	stoppedAt := time.Now()
	// Fencing ends the tenure as a drain does: the release hook ran, once,
	// after the acquire hook, for every shard. A stopping shard stops
	// counting as held first and runs the hook last (after leaving its
	// cache), so the hooks are in order now and all ended soon after.
	if n, bad := rc.tenures.check(false); len(bad) > 0 || n != shards {
		t.Errorf("tenure hooks of %d shards, want %d; out of order: %v", n, shards, bad)
	}
	controlplane.Eventually(t, time.Minute, "every tenure ended", func() error {
		if n, bad := rc.tenures.check(true); len(bad) > 0 || n != shards {
			return fmt.Errorf("tenure hooks of %d shards, want %d; out of order or not ended: %v", n, shards, bad)
		}
		return nil
	})
	// Every Lease it held is still unexpired in the API server's eyes at
	// the time it stopped: nobody could have taken over yet. (Its last
	// renewal is at least as late as what we read before the cut.)
	current := shardHolders(t, c, ns, ring)
	for n, l := range current {
		if holderOf(l) != "fenced" {
			t.Fatalf("shard %d held by %q after the cut", n, holderOf(l))
		}
		if !stoppedAt.Before(leaseExpiry(l)) {
			t.Errorf("shard %d stopped at %v, after its Lease expired at %v", n, stoppedAt, leaseExpiry(l))
		}
		if leaseExpiry(l).Before(leaseExpiry(leases[n])) {
			t.Fatalf("shard %d Lease went backwards", n)
		}
	}
}

// TestLabeler: unlabeled, out-of-range and wrong-label objects all end up
// correctly labeled and reconciled.
func TestLabeler(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "labeler"
	mk := func(name, domain string, labels map[string]string) {
		cb := &configv1alpha1.ConfigBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: configv1alpha1.ConfigBindingSpec{Domain: domain, Keys: []configv1alpha1.ConfigKey{"k"},
				Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: name}},
		}
		if err := c.Create(context.Background(), cb); err != nil {
			t.Fatal(err)
		}
	}
	wrong := fmt.Sprint((sharding.ShardOf("payments", shards) + 1) % shards)
	mk("unlabeled", "payments", nil)
	mk("out-of-range", "payments", map[string]string{sharding.LabelShard: "999"})
	mk("garbage", "shipping", map[string]string{sharding.LabelShard: "x"})
	mk("wrong", "payments", map[string]string{sharding.LabelShard: wrong})
	startReplica(t, ringConfig(ns, ring, "r-0"))
	startReplica(t, ringConfig(ns, ring, "r-1"))
	controlplane.Eventually(t, 2*time.Minute, "all labeled and reconciled", func() error { return allReconciled(c, ns, ring, t) })
	var cb configv1alpha1.ConfigBinding
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "wrong"}, &cb); err != nil {
		t.Fatal(err)
	}
	if cb.Labels[sharding.LabelDomain] != "payments" {
		t.Fatalf("domain label = %q", cb.Labels[sharding.LabelDomain])
	}
}

// TestShardCountMismatch: a replica started with another shard count than
// the ring's claims nothing, and says so.
func TestShardCountMismatch(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "mismatch"
	a := startReplica(t, ringConfig(ns, ring, "r-0"))
	b := startReplica(t, ringConfig(ns, ring, "r-1"))
	expectRingHeld(t, c, ns, ring, []string{"r-0", "r-1"})
	odd := ringConfig(ns, ring, "r-odd")
	odd.shards = shards / 2
	m := startReplica(t, odd)
	// The odd replica announces itself (its member Lease exists) ...
	controlplane.Eventually(t, time.Minute, "odd member Lease", func() error {
		var l coordinationv1.Lease
		return c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: lease.MemberName(ring, "r-odd")}, &l)
	})
	// ... and is not ready, holds nothing, and the others keep the ring.
	controlplane.Eventually(t, time.Minute, "odd replica reports the mismatch", func() error {
		if err := m.rep.Ready(); err == nil {
			return fmt.Errorf("mismatching replica reports ready")
		}
		return nil
	})
	for range 5 {
		time.Sleep(fastTiming.retry)
		if held := m.rep.HeldShards(); len(held) > 0 {
			t.Fatalf("mismatching replica holds %v", held)
		}
		for n, l := range shardHolders(t, c, ns, ring) {
			if holderOf(l) == "r-odd" {
				t.Fatalf("shard %d Lease held by the mismatching replica", n)
			}
		}
	}
	// A renewal the loaded API server answers too late fences a shard for
	// a moment (two make test runs at once did): the ring is whole again
	// by itself.
	controlplane.Eventually(t, time.Minute, "the agreeing replicas hold every shard", func() error {
		if n := len(a.rep.HeldShards()) + len(b.rep.HeldShards()); n != shards {
			return fmt.Errorf("they hold %d+%d shards", len(a.rep.HeldShards()), len(b.rep.HeldShards()))
		}
		return nil
	})
}

// TestStatefulSetRestartKeepsShards: a replica that stops while its ordinal
// is below the StatefulSet's replicas keeps its ring position: nobody takes
// its shards, and it reclaims them on return. Scaled below its ordinal, it
// leaves and hands over.
func TestStatefulSetRestartKeepsShards(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ringName := "sts"
	sts := createStatefulSet(t, c, ns, 2)
	cfg := func(id string) replicaConfig {
		rc := ringConfig(ns, ringName, id)
		// Long member Leases: the restart window.
		rc.timing = timing{lease: 30 * time.Second, renew: 20 * time.Second, retry: time.Second}
		rc.statefulSet = "kshard"
		return rc
	}
	r0 := startReplica(t, cfg("kshard-0"))
	r1 := startReplica(t, cfg("kshard-1"))
	_ = r0
	members := []string{"kshard-0", "kshard-1"}
	expectRingHeld(t, c, ns, ringName, members)
	mine := ring.New(shards, members).ShardsOf("kshard-1")

	// Restart: ordinal 1 < 2 replicas.
	r1.stop(t)
	for range 3 {
		time.Sleep(time.Second)
		leases := shardHolders(t, c, ns, ringName)
		for _, n := range mine {
			if h := holderOf(leases[n]); h != "" {
				t.Fatalf("shard %d of the restarting replica taken by %q", n, h)
			}
		}
	}
	var member coordinationv1.Lease
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: lease.MemberName(ringName, "kshard-1")}, &member); err != nil {
		t.Fatalf("restarting replica's member Lease: %v", err)
	}
	r1 = startReplica(t, cfg("kshard-1"))
	expectRingHeld(t, c, ns, ringName, members)

	// Scale-down: 1 replica, so ordinal 1 leaves and hands over.
	sts.Spec.Replicas = ptr.To(int32(1))
	if err := c.Update(context.Background(), sts); err != nil {
		t.Fatal(err)
	}
	r1.stop(t)
	expectRingHeld(t, c, ns, ringName, []string{"kshard-0"})
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: lease.MemberName(ringName, "kshard-1")}, &member); err == nil {
		t.Fatal("the leaving replica's member Lease still exists")
	}
}

// cutProxy forwards TCP to the API server until cut, then drops every
// connection and refuses new ones: a network partition on loopback.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	isCut  bool
}

func newCutProxy(t *testing.T, apiHost string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(apiHost)
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: u.Host}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.isCut {
				p.mu.Unlock()
				in.Close()
				continue
			}
			out, err := net.Dial("tcp", p.target)
			if err != nil {
				p.mu.Unlock()
				in.Close()
				continue
			}
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go pipe(in, out)
			go pipe(out, in)
		}
	}()
	return p
}

func pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// gathered sums the series of one ring of a metric in controller-runtime's
// registry: other tests' replicas of other rings run in the same process.
// Label pairs in match narrow the series further.
func gathered(name, ring string, match ...string) (float64, error) {
	families, err := metrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	want := map[string]string{"ring": ring}
	for i := 0; i+1 < len(match); i += 2 {
		want[match[i]] = match[i+1]
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		sum := 0.0
		for _, m := range f.GetMetric() {
			found := 0
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
					found++
				}
			}
			if found == len(want) {
				sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		return sum, nil
	}
	return 0, fmt.Errorf("metric %s not registered", name)
}

// createStatefulSet creates an inert StatefulSet "kshard" (nothing runs its
// pods here) that replicas read for their peers and termination intent.
func createStatefulSet(t *testing.T, c client.Client, ns string, replicas int32) *appsv1.StatefulSet {
	t.Helper()
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kshard"},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "kshard"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "kshard"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "kshard", Image: "kshard"}}},
			},
		},
	}
	if err := c.Create(context.Background(), sts); err != nil {
		t.Fatal(err)
	}
	return sts
}

// TestStartupDoesNotOverClaim: replicas of a StatefulSet that start one
// after another each claim only their final share from the start: the first
// does not take every shard and hand most of them over as the others join
// (each such move is a LIST, a cold cache and a reconcile per object).
//
// A replica counts the StatefulSet's desired replicas as ring members for
// its startup grace, so within it, whenever its peers join, it holds at
// most its final share, exactly: that is what is checked, over the window
// each replica's own start opens, rather than a peak over the whole run
// bounded by a margin (a peer that joins after the grace, on a busy
// machine, is rightly covered for until it does). It runs alone (not
// parallel), so that the peers usually join within the grace and the ring
// settles as one.
func TestStartupDoesNotOverClaim(t *testing.T) {
	c := newClient(t)
	ns := newNamespace(t, c)
	ringName := "startup"
	createBindings(t, c, ns, 100, 20)
	createStatefulSet(t, c, ns, 3)
	ids := []string{"kshard-0", "kshard-1", "kshard-2"}
	var mu sync.Mutex
	peak, samples := map[string]int{}, map[string]int{}
	type started struct {
		r  *replica
		at time.Time
	}
	reps := map[string]started{}
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			mu.Lock()
			for id, s := range reps {
				// The grace starts once the replica has read the ring,
				// after at: until at+StartupGrace it is in its grace.
				if time.Since(s.at) < sharding.DefaultStartupGrace {
					peak[id] = max(peak[id], len(s.r.rep.HeldShards()))
					samples[id]++
				}
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	for _, id := range ids {
		rc := ringConfig(ns, ringName, id)
		rc.statefulSet = "kshard"
		at := time.Now()
		r := startReplica(t, rc)
		mu.Lock()
		reps[id] = started{r: r, at: at}
		mu.Unlock()
		// Late peers: without the StatefulSet's word, the first would
		// hold everything until they join.
		time.Sleep(time.Second)
	}
	expectRingHeld(t, c, ns, ringName, ids)
	close(stop)
	<-sampled
	final := ring.New(fullShards, ids)
	for _, id := range ids {
		share := len(final.ShardsOf(id))
		t.Logf("%s: held up to %d shards in its startup grace (%d samples); its final share is %d", id, peak[id], samples[id], share)
		if peak[id] > share {
			t.Errorf("%s held up to %d shards in its startup grace; its final share is %d", id, peak[id], share)
		}
		if samples[id] == 0 {
			t.Errorf("%s: never sampled in its startup grace", id)
		}
	}
}

// TestMismatchedLabelerStepsDown: the elected labeler whose shard count
// stops agreeing with the ring's (a rolling update changing --shards) steps
// down, and a replica that agrees labels while the odd one still runs: every
// object created meanwhile is labeled by the ring's count and reconciled.
// The odd one used to keep the labeler Lease and label nothing, so no object
// created while it ran was ever reconciled.
func TestMismatchedLabelerStepsDown(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "oddleader"
	odd := ringConfig(ns, ring, "r-odd")
	odd.shards = shards / 2
	m := startReplica(t, odd)
	// Alone, it is the ring (of shards/2) and the elected labeler.
	controlplane.Eventually(t, time.Minute, "the odd replica elected", func() error {
		if h := labelerHolder(t, c, ns, ring); h != "r-odd" {
			return fmt.Errorf("labeler Lease held by %q", h)
		}
		return m.rep.Ready()
	})
	startReplica(t, ringConfig(ns, ring, "r-0"))
	startReplica(t, ringConfig(ns, ring, "r-1"))
	expectRingHeld(t, c, ns, ring, []string{"r-0", "r-1"})
	controlplane.Eventually(t, time.Minute, "the odd replica sees the mismatch", func() error {
		if m.rep.Ready() == nil {
			return fmt.Errorf("still ready")
		}
		return nil
	})
	controlplane.Eventually(t, time.Minute, "an agreeing replica elected", func() error {
		if h := labelerHolder(t, c, ns, ring); h != "r-0" && h != "r-1" {
			return fmt.Errorf("labeler Lease held by %q", h)
		}
		return nil
	})

	keys := createBindings(t, c, ns, 40, 40)
	var wrong string
	controlplane.Eventually(t, 2*time.Minute, "every object labeled and reconciled", func() error {
		for _, k := range keys {
			var cb configv1alpha1.ConfigBinding
			if err := c.Get(context.Background(), k, &cb); err != nil {
				return err
			}
			if v, ok := cb.Labels[sharding.LabelShard]; ok && v != fmt.Sprint(sharding.ShardOf(cb.Spec.Domain, shards)) && wrong == "" {
				wrong = fmt.Sprintf("%s (domain %s) labeled %s", cb.Name, cb.Spec.Domain, v)
			}
		}
		return allReconciled(c, ns, ring, t)
	})
	if wrong != "" {
		t.Errorf("an object labeled by another shard count: %s", wrong)
	}
	if h := labelerHolder(t, c, ns, ring); h == "r-odd" {
		t.Errorf("the odd replica holds the labeler Lease again")
	}
}

// labelerHolder is the replica holding a ring's labeler Lease, "" if none.
func labelerHolder(t testing.TB, c client.Client, ns, ring string) string {
	t.Helper()
	var l coordinationv1.Lease
	err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: lease.LabelerName(ring)}, &l)
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return holderOf(l)
}

// TestTwoRingsShareANamespace: two controllers' rings in one Lease
// namespace each hold all their shards, under Lease names of their own
// (they took each other's Leases when names named no ring).
func TestTwoRingsShareANamespace(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	startReplica(t, ringConfig(ns, "alpha", "a-0"))
	startReplica(t, ringConfig(ns, "beta", "b-0"))
	expectRingHeld(t, c, ns, "alpha", []string{"a-0"})
	expectRingHeld(t, c, ns, "beta", []string{"b-0"})
	for _, ring := range []string{"alpha", "beta"} {
		for n, l := range shardHolders(t, c, ns, ring) {
			if l.Name != lease.ShardName(ring, n) || !strings.HasPrefix(l.Name, ring+"-") {
				t.Errorf("ring %s: shard %d's Lease is named %s", ring, n, l.Name)
			}
		}
	}
}

// TestLeaseHistoryTakenFromLive: the skew test's checker sees a Lease
// taken straight from a holder that wrote it a moment before, and not one
// taken after a release.
func TestLeaseHistoryTakenFromLive(t *testing.T) {
	h := &leaseHistory{last: map[string]coordinationv1.Lease{}, seen: map[string]time.Time{}}
	version := func(name, holder string) coordinationv1.Lease {
		now := metav1.NewMicroTime(time.Now())
		return coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), AcquireTime: &now, RenewTime: &now}}
	}
	h.observe(version("shard-1", "a_1"))
	h.observe(version("shard-1", "b_1")) // at once: a planted takeover
	h.observe(version("shard-2", "a_1"))
	h.observe(version("shard-2", "")) // released
	h.observe(version("shard-2", "b_1"))
	if len(h.fromLive) != 1 || !strings.HasPrefix(h.fromLive[0], "shard-1 taken by b_1") {
		t.Errorf("taken from a live holder: %q, want shard-1's takeover only", h.fromLive)
	}
}

// TestClockSkewTakesNoLiveLease: replicas whose clocks are 30 s ahead and 30 s
// behind (five lease durations) join a ring; nobody takes a Lease from a
// live holder, and the slow replica is not taken for dead. Expiry was judged from the renew times the holders
// wrote: the fast replica found every live Lease expired, and the others
// found the slow replica's member Lease expired.
func TestClockSkewTakesNoLiveLease(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ringName := "skew"
	history := watchLeases(t, ns, ringName)
	startReplica(t, ringConfig(ns, ringName, "r-0"))
	startReplica(t, ringConfig(ns, ringName, "r-1"))
	expectRingHeld(t, c, ns, ringName, []string{"r-0", "r-1"})
	fast := ringConfig(ns, ringName, "r-fast")
	fast.clockSkew = 30 * time.Second
	startReplica(t, fast)
	slow := ringConfig(ns, ringName, "r-slow")
	slow.clockSkew = -30 * time.Second
	startReplica(t, slow)
	members := []string{"r-0", "r-1", "r-fast", "r-slow"}
	holders := func() error {
		want := ring.New(shards, members)
		for n, l := range shardHolders(t, c, ns, ringName) {
			if holderOf(l) != want.Owner(n) {
				return fmt.Errorf("shard %d held by %q, ring owner %q", n, holderOf(l), want.Owner(n))
			}
		}
		return nil
	}
	controlplane.Eventually(t, 2*time.Minute, "every shard held by its owner in the ring of four", holders)
	// Two lease durations more: long enough for skewed renew times to be
	// misread as expired.
	time.Sleep(2 * fastTiming.lease)
	if err := holders(); err != nil {
		t.Errorf("after two lease durations: %v", err)
	}
	history.mu.Lock()
	defer history.mu.Unlock()
	// A holder that missed its renewals on a loaded machine loses its
	// Leases to expiry, rightly; one taken while its holder still wrote
	// them is the defect.
	if len(history.fromLive) > 0 {
		t.Errorf("%d shard Leases taken from a live holder: %s", len(history.fromLive), strings.Join(history.fromLive, "; "))
	}
}
