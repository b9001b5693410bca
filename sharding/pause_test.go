package sharding_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding/lease"
)

// TestPausedReplicaWritesNothingAfterTakeover: a replica frozen (SIGSTOP)
// longer than its Leases under continuous spec updates, then thawed, writes
// nothing for a shard another replica took over meanwhile. Its in-flight
// reconciles and queued requests resume before its renewal loop can notice
// the lost Leases; only a time-based hold (Replica.WriteContext) stops
// their writes. Every write the API server committed (its audit log) falls
// inside its writer's tenure of the shard's Lease, in the API server's own
// order (resourceVersions), its writer named down to the incarnation. The
// paused replica is the elected labeler, which must come back (its lost
// labeler election costs the labeling only) and rejoin the ring.
func TestPausedReplicaWritesNothingAfterTakeover(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "pause"
	keys := createBindings(t, c, ns, 150, 40)
	procs := map[string]*replicaProcess{}
	for _, id := range []string{"p-0", "p-1"} {
		procs[id] = startReplicaProcess(t, id, ns, ring, fastTiming, "")
	}
	expectRingHeld(t, c, ns, ring, []string{"p-0", "p-1"})
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled", func() error { return allReconciled(c, ns, ring, t) })

	stopUpdates := updateContinuously(t, c, keys)

	// Pause the elected labeler, the harder case: its labeler Lease expires
	// too, and losing it must cost the labeling only, not the process.
	var victim, other string
	controlplane.Eventually(t, time.Minute, "a labeler elected", func() error {
		var l coordinationv1.Lease
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: lease.LabelerName(ring)}, &l); err != nil {
			return err
		}
		victim = holderOf(l)
		if victim != "p-0" && victim != "p-1" {
			return fmt.Errorf("labeler Lease held by %q", victim)
		}
		return nil
	})
	other = map[string]string{"p-0": "p-1", "p-1": "p-0"}[victim]
	time.Sleep(2 * time.Second) // the paused replica has reconciles in flight
	paused := procs[victim].cmd.Process
	if err := paused.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := paused.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	defer thaw()
	expectRingHeld(t, c, ns, ring, []string{other})
	time.Sleep(2 * time.Second) // the new holder writes the moved shards' objects
	thaw()
	expectRingHeld(t, c, ns, ring, []string{"p-0", "p-1"})
	stopUpdates()
	controlplane.Eventually(t, 2*time.Minute, "latest generation of every object reconciled", func() error { return allReconciled(c, ns, ring, t) })

	// The API server's own record of every write it committed, each
	// checked against the holder the shard's Lease had at that revision.
	log, err := audit.ReadAPILogFile(apiAudit)
	if err != nil {
		t.Fatal(err)
	}
	e := audit.CheckExclusive(log, audit.CheckOptions{Ring: ring, LeaseNamespace: ns, Namespaces: []string{ns, ""}})
	if !e.OK() {
		t.Errorf("writes outside their writer's tenure, by the API server's audit log:\n%s", e)
	}
	writes := map[string]int{}
	for _, w := range log.Writes {
		if w.Namespace == ns && w.Resource == "configbindings/status" && w.Holder != "" && w.Code < 300 {
			writes[lease.HolderReplica(w.Holder)]++
		}
	}
	t.Logf("paused the labeler %s; committed status writes by replica: %v; %s", victim, writes, e)
	if writes["p-0"] == 0 || writes["p-1"] == 0 {
		t.Fatalf("want writes from both replicas, got %v", writes)
	}
}
