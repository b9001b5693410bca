package sharding_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
)

// TestPausedReplicaWritesNothingAfterTakeover: a replica frozen (SIGSTOP)
// longer than its Leases under continuous spec updates, then thawed, writes
// nothing for a shard another replica took over meanwhile. Its in-flight
// reconciles and queued requests resume before its renewal loop can notice
// the lost Leases; only a time-based hold (Replica.WriteContext) stops
// their writes. Every write in the audit log falls inside its writer's
// tenure of the shard's Lease, as the Lease's own history shows it. The
// paused replica is the elected labeler, which must come back (its lost
// labeler election costs the labeling only) and rejoin the ring.
func TestPausedReplicaWritesNothingAfterTakeover(t *testing.T) {
	t.Parallel() // own namespace, ring and Leases; its replicas watch that namespace only
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "pause"
	keys := createBindings(t, c, ns, 150, 40)
	history := watchLeases(t, ns, ring)
	dir := t.TempDir()
	auditOf := func(id string) string { return filepath.Join(dir, id+".jsonl") }
	procs := map[string]*replicaProcess{}
	for _, id := range []string{"p-0", "p-1"} {
		procs[id] = startReplicaProcess(t, id, ns, ring, fastTiming, auditOf(id))
	}
	expectRingHeld(t, c, ns, ring, []string{"p-0", "p-1"})
	controlplane.Eventually(t, 2*time.Minute, "all objects reconciled", func() error { return allReconciled(c, ns, ring, t) })

	stopUpdates := updateContinuously(t, c, keys)

	// Pause the elected labeler, the harder case: its labeler Lease expires
	// too, and losing it must cost the labeling only, not the process.
	var victim, other string
	controlplane.Eventually(t, time.Minute, "a labeler elected", func() error {
		var l coordinationv1.Lease
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: sharding.LabelerLeaseName(ring)}, &l); err != nil {
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

	writes := map[string]int{}
	for _, id := range []string{"p-0", "p-1"} {
		f, err := os.Open(auditOf(id))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var rec sharding.AuditRecord
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil || rec.Event != "write" {
				continue
			}
			writes[rec.Replica]++
			// The write reached the API server by the earlier of its
			// return and the end of the hold it was granted under.
			at := rec.Time
			if rec.Until != nil && rec.Until.Before(at) {
				at = *rec.Until
			}
			if h := history.holderAt(sharding.ShardLeaseName(ring, rec.Shard), at); sharding.HolderReplica(h) != rec.Replica {
				t.Errorf("%s wrote %s/%s of shard %d at %s while %q held the shard", rec.Replica, rec.Namespace, rec.Name,
					rec.Shard, at.Format(time.StampMicro), h)
			}
		}
		f.Close()
	}
	t.Logf("paused the labeler %s; writes in the audit log: %v", victim, writes)
	if writes["p-0"] == 0 || writes["p-1"] == 0 {
		t.Fatalf("want writes from both replicas, got %v", writes)
	}
}
