package sharding_test

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
)

// TestMeasureHandover measures handover times with real replica processes
// and prints them; it asserts only that handovers complete. It is skipped
// unless KSHARD_MEASURE_HANDOVER is set (to the object count):
//
//	KSHARD_MEASURE_HANDOVER=3000 go test -run TestMeasureHandover -v ./sharding/
//
// A handover counts as done when every shard is held by the ring's desired
// owner and every object shows, in status, that the new holder reconciled it
// (so it includes the new owner's LIST, informer sync and reconcile).
func TestMeasureHandover(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KSHARD_MEASURE_HANDOVER"))
	if n == 0 {
		t.Skip("set KSHARD_MEASURE_HANDOVER=<objects> to measure")
	}
	c := newClient(t)
	ns := newNamespace(t, c)
	ring := "measure"
	createBindings(t, c, ns, n, max(n/10, 1))
	tm := timing{lease: sharding.DefaultLeaseDuration, renew: sharding.DefaultRenewDeadline, retry: sharding.DefaultRetryPeriod}
	procs := map[string]*replicaProcess{}
	for _, id := range []string{"p-0", "p-1", "p-2"} {
		procs[id] = startReplicaProcess(t, id, ns, ring, tm, "")
	}
	settled := func(what string, members []string, from time.Time) time.Duration {
		expectRingHeld(t, c, ns, ring, members)
		held := time.Since(from)
		controlplane.Eventually(t, 5*time.Minute, what, func() error { return allReconciled(c, ns, ring, t) })
		all := time.Since(from)
		t.Logf("%-28s shards held by new owners after %6.2fs, every object reconciled by them after %6.2fs", what, held.Seconds(), all.Seconds())
		return all
	}
	settled("initial start (3 replicas)", []string{"p-0", "p-1", "p-2"}, time.Now())

	start := time.Now()
	procs["p-3"] = startReplicaProcess(t, "p-3", ns, ring, tm, "")
	settled("join (3→4)", []string{"p-0", "p-1", "p-2", "p-3"}, start)

	start = time.Now()
	if err := procs["p-3"].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	settled("graceful leave (4→3)", []string{"p-0", "p-1", "p-2"}, start)
	_ = procs["p-3"].cmd.Wait()

	start = procs["p-2"].kill(t)
	settled("crash, SIGKILL (3→2)", []string{"p-0", "p-1"}, start)
	fmt.Fprintf(os.Stderr, "objects=%d shards=%d lease=%s renew=%s retry=%s\n", n, fullShards, tm.lease, tm.renew, tm.retry)
}
