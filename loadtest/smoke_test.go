package loadtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
)

var cp *controlplane.ControlPlane

// apiAudit is the test control plane's own audit log (internal/audit's
// Policy), which the smoke run's write check reads.
var apiAudit string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	// The load tester's watches log through controller-runtime.
	ctrllog.SetLogger(logr.Discard())
	dir, err := os.MkdirTemp("", "kshard-loadtest-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	apiAudit = filepath.Join(dir, "apiserver-audit.log")
	return controlplane.RunTestsWith(m, &cp, controlplane.Options{AuditLogPath: apiAudit})
}

// testWriter sends the progress output to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestSmoke runs the basic scenario end to end, small: real kshard and
// configcenter processes against the test control plane, a few hundred
// objects created and updated, and the report with its checks.
func TestSmoke(t *testing.T) {
	controlplane.Require(t, cp)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeconfigBytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "results")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := Run(ctx, Options{
		Scenario:   "basic",
		Objects:    300,
		Domains:    30,
		Replicas:   3,
		Duration:   8 * time.Second,
		UpdateRate: 0.05,
		// Short: the calibration is exercised, not measured well.
		CalibrateFor:      2 * time.Second,
		Kubeconfig:        kubeconfig,
		APIServerAuditLog: apiAudit,
		Out:               out,
		WorkDir:           filepath.Join(dir, "work"),
		Command:           "go test -run TestSmoke ./loadtest/",
		Progress:          testWriter{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if !c.Passed {
			t.Errorf("check failed: %s: %s", c.Name, c.Detail)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "basic.md"))
	if err != nil {
		t.Fatalf("the report: %v", err)
	}
	for _, want := range []string{"**Result: PASSED**", "go test -run TestSmoke ./loadtest/", "| sharded ×3 |",
		"| " + checkWrites + " | pass |", "| peak RSS ÷ memory limit (largest replica) |", "| create storm: controller writes per second ÷ the calibrated ceiling |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if len(rep.Fleets) != 1 {
		t.Fatalf("%d fleets, want 1", len(rep.Fleets))
	}
	// The write check had writes to check, against at least one
	// acquisition of every shard's Lease, from the API server's audit log.
	t.Logf("write check: %s", rep.Writes.check("").Detail)
	if w := rep.Writes; w == nil || w.Writes() == 0 || w.LeaseWrites < 64 || w.Fencing != fencingBound {
		t.Errorf("write evidence %+v: want replica writes, fenced by deploy/base's policy, checked against every shard's Lease", w)
	}
	f := rep.Fleets[0]
	// Every figure was read from Prometheus, but those of a span the run
	// does not have (no fleet start on existing objects, no config-center
	// changes): a figure a query found no data for is never a 0.
	value := map[string]float64{}
	for _, x := range f.Figures {
		switch {
		case x.noSpan(), strings.HasPrefix(x.NoData, notScraped), strings.HasPrefix(x.NoData, notApplicable):
		case x.NoData != "":
			t.Errorf("figure %q: %s: %s", x.Name, x.NoData, x.Query)
		default:
			value[x.Name] = x.Value
		}
	}
	for name, want := range map[string]func(float64) bool{
		"replica processes (restarts included)":                                                                   func(v float64) bool { return v == 3 },
		"heap in use per replica, peak (largest)":                                                                 func(v float64) bool { return v > 0 },
		"peak RSS ÷ memory limit (largest replica)":                                                               func(v float64) bool { return v > 0 && v < 1 },
		"shard Leases the replicas acquired (kshard_shard_handovers_total)":                                       func(v float64) bool { return v >= 64 },
		"throughput: generations Ready per second":                                                                func(v float64) bool { return v > 0 },
		"create storm: controller writes per object":                                                              func(v float64) bool { return v >= 1 },
		"controller API writes per spec update (ConfigBindings and ConfigMaps, the load tester's own subtracted)": func(v float64) bool { return v >= 1 && v <= 4 },
	} {
		if v, ok := value[name]; !ok || !want(v) {
			t.Errorf("figure %q = %v (read %v)", name, v, ok)
		}
	}
	// Every informer the API server synced for the replicas is one of the
	// caches they report, and a cache serves the shards acquired together,
	// not one. An informer may sync twice: client-go relists after a watch
	// that ended with an error (the labeler's, whose selector matches no
	// object, did so once in CI), and a relist is the same informer again.
	// The audit log is the authority on the informers: the fleet's life in
	// Prometheus can miss a sync at its very start on a loaded machine (3
	// syncs for 4 informers in two make test runs at once).
	syncs := value["initial syncs of ConfigBindings: LISTs + watch-lists (API server, every client)"] - value["… of them the load tester's own"]
	caches := value["informer caches the replicas started (kshard_caches_started_total)"]
	informers, replicaSyncs := replicaInformers(t, "configbindings", start)
	t.Logf("%v initial syncs of ConfigBindings (%d by replicas in the audit log, of %d informers); the replicas report %v caches", syncs, replicaSyncs, informers, caches)
	if informers < 1 || float64(informers) > caches || caches > 32 || syncs < 1 || syncs > 2*float64(informers) {
		t.Errorf("the API server served %v syncs of ConfigBindings to %d informers of the replicas, which report %v caches for 64 shards", syncs, informers, caches)
		logSyncs(t, "configbindings")
	}
	// The replicas held every object between them at the end, once each.
	var held float64
	for _, r := range f.ReplicaFigures {
		for _, x := range r.Figures {
			if x.Name == "shards at the end of the load" && x.NoData == "" {
				held += x.Value
			}
		}
	}
	switch {
	case held > 64:
		t.Errorf("the replicas held %v shards at the end of the load: some twice", held)
	case held < 64:
		t.Logf("the replicas held %v of the 64 shards at the end of the load: a shard was between holders", held)
	}
	if !rep.Machine.Calibration.measured() {
		t.Errorf("no write ceiling: %+v", rep.Machine.Calibration)
	}
	if s := f.Storm; s.Kind != stormCreates || !s.Settled || s.Objects != 300 {
		t.Errorf("the create storm: %+v", s)
	}
}

// replicaInformers counts the informers of kshard replicas (a process and
// its request's path and selectors) the test control plane's audit log
// shows syncing resource since a time, and their syncs.
func replicaInformers(t *testing.T, resource string, since time.Time) (informers, syncs int) {
	t.Helper()
	l, err := audit.ReadAPILogFile(apiAudit)
	if err != nil {
		t.Fatalf("reading the API server's audit log: %v", err)
	}
	seen := map[string]bool{}
	for _, s := range l.Syncs {
		if s.Resource != resource || s.Holder == "" || s.Received.Before(since) {
			continue
		}
		syncs++
		seen[s.Holder+" "+s.Group] = true
	}
	return len(seen), syncs
}

// logSyncs logs every initial sync of resource in the test control
// plane's audit log, for a failed count to say who synced and when.
func logSyncs(t *testing.T, resource string) {
	l, err := audit.ReadAPILogFile(apiAudit)
	if err != nil {
		t.Logf("reading the API server's audit log: %v", err)
		return
	}
	for _, s := range l.Syncs {
		if s.Resource == resource {
			t.Logf("sync at %s by %s %s: %s", s.Received.Format(time.StampMilli), s.Username, s.Holder, s.Group)
		}
	}
}
