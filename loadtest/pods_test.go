package loadtest

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// statefulSetOf builds a kustomization of the repository and returns its
// kshard StatefulSet.
func statefulSetOf(t *testing.T, dir string) *appsv1.StatefulSet {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join("..", dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	for _, r := range res.Resources() {
		if r.GetKind() != "StatefulSet" {
			continue
		}
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var sts appsv1.StatefulSet
		if err := yaml.UnmarshalStrict(b, &sts); err != nil {
			t.Fatal(err)
		}
		return &sts
	}
	t.Fatalf("%s has no StatefulSet", dir)
	return nil
}

// TestPodTargetReadsTheShippedStatefulSet: the load tester drives the
// StatefulSet `make e2e` installs (e2e/overlay) as it is, taking the Lease
// timing and memory limit from it, and refuses deploy/node without the
// audit records on standard output, saying how to get them.
func TestPodTargetReadsTheShippedStatefulSet(t *testing.T) {
	sts := statefulSetOf(t, "e2e/overlay")
	var tgt podTarget
	o := Options{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 5 * time.Second}
	if err := tgt.readTemplate(sts, &o); err != nil {
		t.Fatalf("e2e/overlay: %v", err)
	}
	if tgt.container != "kshard" || tgt.ring != "kshard" || tgt.metricsPort != 8443 || tgt.image != "kshard:dev" {
		t.Errorf("container %q, ring %q, metrics port %d, image %q; want kshard, kshard, 8443, kshard:dev", tgt.container, tgt.ring, tgt.metricsPort, tgt.image)
	}
	if o.MemoryLimit != "512Mi" {
		t.Errorf("memory limit %q, want the container's 512Mi", o.MemoryLimit)
	}

	// The pods' own Lease flags win over the defaults.
	c := &sts.Spec.Template.Spec.Containers[0]
	c.Args = append(c.Args, "--lease-duration=30s", "--renew-deadline", "20s", "--ring=orders")
	if err := tgt.readTemplate(sts, &o); err != nil {
		t.Fatal(err)
	}
	if o.LeaseDuration != 30*time.Second || o.RenewDeadline != 20*time.Second || o.RetryPeriod != 5*time.Second || tgt.ring != "orders" {
		t.Errorf("lease %s / %s / %s, ring %q; want 30s / 20s / 5s, orders", o.LeaseDuration, o.RenewDeadline, o.RetryPeriod, tgt.ring)
	}

	err := tgt.readTemplate(statefulSetOf(t, "deploy/node"), &o)
	if err == nil || !strings.Contains(err.Error(), "--audit-log=-") {
		t.Errorf("deploy/node without --audit-log=-: %v; want an error naming the flag", err)
	}
}

// TestPodTargetRefusesProcessSettings: what only replica processes can do
// is an error on pods, naming what runs instead, before any default hides
// that the caller set it.
func TestPodTargetRefusesProcessSettings(t *testing.T) {
	base := Options{StatefulSet: "kshard-system/kshard", Kubeconfig: "k"}
	if err := base.checkPodTarget(scenarios["chaos"]); err != nil {
		t.Errorf("chaos on pods: %v", err)
	}
	for name, o := range map[string]Options{
		"scenario":       base,
		"no kubeconfig":  {StatefulSet: base.StatefulSet},
		"lease duration": {StatefulSet: base.StatefulSet, Kubeconfig: "k", LeaseDuration: time.Minute},
		"pause":          {StatefulSet: base.StatefulSet, Kubeconfig: "k", PauseFor: time.Minute},
		"replica args":   {StatefulSet: base.StatefulSet, Kubeconfig: "k", ReplicaArgs: []string{"--x"}},
	} {
		sc := scenarios["chaos"]
		if name == "scenario" {
			sc = scenarios["handover"]
		}
		if err := o.checkPodTarget(sc); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestContainerEndsWhenGoneAndLogEnded: a container counts as running until
// the API server showed it gone and its log ended, and ended at the later
// of the two — after a forced deletion the pod object goes first while
// the process still has its SIGTERM grace.
func TestContainerEndsWhenGoneAndLogEnded(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &container{done: make(chan struct{})}
	c.seenGone(t0)
	if !c.running() {
		t.Fatal("ended when only its pod was gone")
	}
	c.logDone(t0.Add(2 * time.Second))
	if c.running() {
		t.Fatal("running after its pod and its log ended")
	}
	if at, _ := c.wait(); !at.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("ended at %s, want the log's end", at)
	}

	c = &container{done: make(chan struct{})}
	c.logDone(t0)
	if !c.running() {
		t.Fatal("ended when only its log ended (a broken stream)")
	}
	c.seenGone(t0.Add(time.Second))
	if at, _ := c.wait(); !at.Equal(t0.Add(time.Second)) {
		t.Errorf("ended at %s, want when it was seen gone", at)
	}
}

// TestRunsExactly: a fleet of pods runs exactly n replicas when ordinals
// 0..n-1 each run one container and nothing else runs; pods starting out of
// order leave slots without a container meanwhile.
func TestRunsExactly(t *testing.T) {
	running := func() *instance { return &instance{proc: &container{done: make(chan struct{})}} }
	ended := func() *instance {
		c := &container{done: make(chan struct{})}
		c.seenGone(time.Now())
		c.logDone(time.Now())
		return &instance{proc: c}
	}
	f := &fleet{slots: []*slot{{id: "kshard-0"}, {id: "kshard-1", instances: []*instance{running()}}}}
	if f.runsExactly(2) {
		t.Error("kshard-0 has no container yet")
	}
	f.slots[0].instances = []*instance{ended(), running()}
	if !f.runsExactly(2) || f.runsExactly(1) || f.runsExactly(3) {
		t.Error("two running replicas: want exactly 2")
	}
	// A forced deletion's process still running beside its pod's successor.
	f.slots[1].instances = append([]*instance{running()}, f.slots[1].instances...)
	if f.runsExactly(2) {
		t.Error("an earlier process of kshard-1 still runs")
	}
}

// TestPodTargetChaosInterval: a chaos interval below the process faults'
// pause is fine on pods, which get no pause.
func TestPodTargetChaosInterval(t *testing.T) {
	o := Options{Scenario: "chaos", StatefulSet: "kshard-system/kshard", Kubeconfig: "k", ChaosInterval: 20 * time.Second, Out: t.TempDir(), HPAFile: "x"}
	if err := o.setDefaults(scenarios["chaos"]); err != nil {
		t.Errorf("chaos on pods every 20s: %v", err)
	}
	o = Options{Scenario: "chaos", ChaosInterval: 20 * time.Second, Out: t.TempDir(), HPAFile: "x"}
	if err := o.setDefaults(scenarios["chaos"]); err == nil {
		t.Error("chaos on processes every 20s, below its 25s pause: accepted")
	}
}
