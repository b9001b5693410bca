package sharding_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
	"github.com/kshard/kshard/sharding/ring"
)

// TestFencedShardRejoinsItsCache: a shard fenced while its replica keeps
// the others of its cache (its Lease deleted here; a renewal that missed
// the renew deadline under an overloaded API server in the scale scenario)
// and acquired again by the same replica reads the running cache: the API
// server's audit log shows no sync of ConfigBindings by the replica from
// the fence until the shard is held again, and an update of one of its
// objects is reconciled after. Each such shard used to start a cache of
// its own, a LIST that scans the whole collection, which an overloaded
// server pays again for every renewal it delays. And the replica waits out
// a backoff before it takes the shard again (a fence says it is
// overloaded): the API server's audit log shows the acquisition at least a
// retry period after the last write of the fenced tenure was answered.
// Taken back at once, a replica held to 50m of CPU fenced its own shards
// 449 times in a start and did not settle (docs/scale.md).
func TestFencedShardRejoinsItsCache(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases
	c := newClient(t)
	ns := newNamespace(t, c)
	ringName := "rejoin"
	createBindings(t, c, ns, 40, 20)
	r := startReplica(t, ringConfig(ns, ringName, "r-0"))
	expectRingHeld(t, c, ns, ringName, []string{"r-0"})
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled", func() error { return allReconciled(c, ns, ringName, t) })

	var list configv1alpha1.ConfigBindingList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	cb := list.Items[0]
	n, ok := ring.KeysFor(sharding.DefaultLabelPrefix).ShardLabel(cb.Labels, shardsOf(ringName))
	if !ok {
		t.Fatalf("%s has no shard label: %v", cb.Name, cb.Labels)
	}
	acquired := func() float64 {
		v, err := gathered("kshard_shard_handovers_total", ringName, "direction", "acquire")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := acquired()
	from := time.Now()
	l := &coordinationv1.Lease{}
	l.Namespace, l.Name = ns, lease.ShardName(ringName, n)
	if err := c.Delete(context.Background(), l); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, time.Minute, fmt.Sprintf("shard %d fenced and running again", n), func() error {
		if got := acquired(); got <= before {
			return fmt.Errorf("%.0f shard acquisitions, %.0f before the Lease was deleted", got, before)
		}
		// Ready: every shard runs with a synced cache, so a LIST of a new
		// cache was answered, and the audit log (blocking) recorded it.
		return r.rep.Ready()
	})
	if started := newInformerSyncs(t, ns, "r-0", from, time.Now()); len(started) != 0 {
		t.Errorf("shard %d acquired again: r-0 started %d informers of ConfigBindings meanwhile (the audit log: %v), want none: the running cache covers it", n, len(started), started)
	}
	ended, retaken := retake(t, ns, "r-0", l.Name, from)
	if gap := retaken.Received.Sub(ended.Done); gap < fastTiming.retry {
		t.Errorf("shard %d taken again %s after the last write of its fenced tenure was answered, want at least the retry period %s:\n  %s\n  %s",
			n, gap, fastTiming.retry, ended, retaken)
	}

	cb.Spec.Target.ConfigMapName += "-moved"
	if err := c.Update(context.Background(), &cb); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, time.Minute, "the updated object reconciled by the rejoined shard", func() error { return allReconciled(c, ns, ringName, t) })
}

// newInformerSyncs lists the syncs of ConfigBindings in namespace ns by a
// replica in a window whose informer (path and selectors) the replica had
// not synced before it: a new cache. A relist of a running cache (its watch
// expired) syncs an informer seen before, and is not a new cache. Tests
// running beside this one name their replicas alike, in namespaces of
// their own.
func newInformerSyncs(t *testing.T, ns, replica string, from, to time.Time) []string {
	t.Helper()
	l, err := audit.ReadAPILogFile(apiAudit)
	if err != nil {
		t.Fatalf("reading the API server's audit log: %v", err)
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range l.Syncs {
		if s.Resource != "configbindings" || !strings.Contains(s.Group, "/namespaces/"+ns+"/") ||
			lease.HolderReplica(s.Holder) != replica || s.Received.After(to) {
			continue
		}
		if s.Received.Before(from) {
			seen[s.Group] = true
		} else if !seen[s.Group] {
			out = append(out, s.Group)
		}
	}
	return out
}

// retake finds, in the API server's audit log, a replica's first write in
// namespace ns
// since from that took Lease name (a new acquire time) and the write of the
// Lease by the replica answered last before it: a fenced tenure's last
// renewal attempt.
func retake(t *testing.T, ns, replica, name string, from time.Time) (ended, taken audit.Write) {
	t.Helper()
	l, err := audit.ReadAPILogFile(apiAudit)
	if err != nil {
		t.Fatalf("reading the API server's audit log: %v", err)
	}
	var mine []audit.Write
	for _, w := range l.Writes {
		if w.Resource == "leases" && w.Namespace == ns && w.Name == name && lease.HolderReplica(w.Holder) == replica {
			mine = append(mine, w)
		}
	}
	for i, w := range mine {
		if i == 0 || w.Received.Before(from) || w.Code >= 300 || !w.LeaseAcquired.After(from) {
			continue
		}
		return mine[i-1], w
	}
	t.Fatalf("no acquisition of Lease %s by %s since %s in the audit log (%d writes of it by the replica)", name, replica, from.Format(time.StampMicro), len(mine))
	return
}
