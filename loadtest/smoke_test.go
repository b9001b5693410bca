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
	for _, want := range []string{"**Result: PASSED**", "go test -run TestSmoke ./loadtest/", "| sharded ×3 |", "basic-latency.svg", "basic-ownership.svg", "basic-calls.svg",
		"| " + checkWrites + " | pass |", "| peak resident memory ÷ memory limit (largest replica) |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	for _, c := range rep.Charts {
		if _, err := os.Stat(filepath.Join(out, c.File)); err != nil {
			t.Errorf("chart %s: %v", c.File, err)
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
	// Every count compared below was read: a family no scrape had is -1
	// (the API server's counts need a reading at both ends), never a 0 a
	// comparison could pass on.
	if !f.APICounted || f.Samples == 0 || f.HeldMax < 0 || f.CachesStarted < 0 || f.Acquisitions < 0 || f.UnlabeledPeak < 0 {
		t.Fatalf("a metric the test counts was not read: API server at both ends %v, %d replica scrapes, held %v, caches %v, acquisitions %v, unlabeled %v",
			f.APICounted, f.Samples, f.HeldMax, f.CachesStarted, f.Acquisitions, f.UnlabeledPeak)
	}
	// Every replica ran under deploy/base's limit, measured.
	if f.MemoryLimit != 512<<20 || f.RSSPeakMax <= 0 {
		t.Errorf("memory limit %v, peak RSS %v", f.MemoryLimit, f.RSSPeakMax)
	}
	// Every update issued in the measured phase became Ready (the final
	// settle waits for the last ones), and the replicas held every object
	// between them.
	if f.Updates.Count == 0 || f.Throughput <= 0 {
		t.Errorf("no update measured: %+v", f.Updates)
	}
	var held float64
	for _, rr := range f.PerReplica {
		held += rr.HeldEnd
	}
	// More than 300 is an object held twice. Fewer is a shard between
	// holders at the last scrape: under two make test runs at once (a write
	// ceiling of 52 patches/s, p50 1.3 s per patch) a Lease was lost after
	// the final settle had seen every shard held, and 258 were held at the
	// end. Liveness is checked by every update becoming Ready.
	switch {
	case held > 300:
		t.Errorf("the replicas held %v ConfigBindings at the end: some twice", held)
	case held < 300:
		t.Logf("the replicas held %v of the 300 ConfigBindings at the last scrape: a shard was between holders", held)
	}
	if !rep.Machine.Calibration.measured() {
		t.Errorf("no write ceiling: %+v", rep.Machine.Calibration)
	}
	if s := f.Storm; s.Kind != stormCreates || !s.Settled || s.Objects != 300 || !s.WritesCounted || s.Writes <= 0 {
		t.Errorf("the create storm: %+v", s)
	}
	if !strings.Contains(string(md), "| create storm: controller writes per second ÷ ceiling writes per second |") {
		t.Error("the report lacks the create storm's ceiling row")
	}
	if f.HeapPeakMax <= 0 || f.HeapLivePeakMax <= 0 || f.HeapLiveEndSum <= 0 || f.Syncs < 1 {
		t.Errorf("heap %v, live heap %v (fleet at the end %v), initial syncs %v: the replicas' and the API server's metrics were not read",
			f.HeapPeakMax, f.HeapLivePeakMax, f.HeapLiveEndSum, f.Syncs)
	}
	// Every sync the API server made (the load tester's own subtracted) is
	// one of the caches the replicas report, and a cache serves the shards
	// acquired together, not one: bounded by what the run observed, not by
	// a count of syncs, which depends on how acquisitions batch under load.
	t.Logf("%v initial syncs of ConfigBindings; the replicas report %v caches, %v of them for %v shards acquired", f.Syncs, f.CachesStarted, f.AcquisitionCaches, f.Acquisitions)
	if f.Syncs > f.CachesStarted {
		t.Errorf("the API server served %v syncs of ConfigBindings, the replicas report %v caches", f.Syncs, f.CachesStarted)
	}
	if f.AcquisitionCaches < 1 || f.AcquisitionCaches > f.Acquisitions/2 {
		t.Errorf("%v caches for %v shards acquired, want at least one and at most one per two (one per acquisition batch, not per shard)", f.AcquisitionCaches, f.Acquisitions)
	}
}
