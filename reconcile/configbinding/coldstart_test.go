package configbinding_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// TestColdStartReconcilesOnce: a replica that starts on bindings already
// Ready finds its external cache cold. A reconcile before a key arrives
// finds it pending and writes nothing; the key's arrival requeues the
// binding anyway. So each binding is reconciled once, after its keys
// arrived, not twice (before the fix, every binding twice: at 100,000
// objects the scale scenario's starts reconciled 200,000 times). The config
// center answers in 500 ms here, so the keys arrive well after the initial
// list's events.
func TestColdStartReconcilesOnce(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "coldstart", withStandin)
	const bindings = 16 // the config center's 4 domains × 4 keys, one each
	name := func(i int) string { return fmt.Sprintf("app-%d", i) }
	for i := range bindings {
		e.create(t, name(i), fmt.Sprintf("domain-%d", i/4), fmt.Sprintf("key-%d", i%4))
	}
	for i := range bindings {
		e.waitReason(t, name(i), configbinding.ReasonSynced)
	}
	e.stopFirst()
	if err := e.standin.SetFaults(configcenter.Faults{Latency: configcenter.Duration{Duration: 500 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	gets := e.standin.Stats().Count("", "", configcenter.RouteGetKey, 0)
	since := time.Now()
	next := e.opts
	next.Identity = "coldstart-1"
	e.startReplica(t, next)

	// Every binding reconciled by the new replica, and every key fetched
	// by it, once its reconciles of the arrivals were done.
	controlplane.Eventually(t, 2*time.Minute, "every binding reconciled and every key fetched", func() error {
		for i := range bindings {
			if e.audit.starts(e.ns, name(i), since) == 0 {
				return fmt.Errorf("%s not reconciled since the restart", name(i))
			}
		}
		if n := e.standin.Stats().Count("", "", configcenter.RouteGetKey, 0) - gets; n < bindings {
			return fmt.Errorf("%d of %d keys fetched", n, bindings)
		}
		return nil
	})
	// Room for the reconciles the arrivals would queue: many times the
	// config center's latency.
	time.Sleep(5 * time.Second)
	for i := range bindings {
		if n := e.audit.starts(e.ns, name(i), since); n != 1 {
			t.Errorf("%s reconciled %d times after the restart, want once", name(i), n)
		}
		e.waitReason(t, name(i), configbinding.ReasonSynced)
	}
}
