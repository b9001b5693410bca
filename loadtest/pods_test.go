package loadtest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
		if r.GetKind() != "StatefulSet" || r.GetName() != "kshard" {
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
	t.Fatalf("%s has no StatefulSet kshard", dir)
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
	if !c.Running() {
		t.Fatal("ended when only its pod was gone")
	}
	c.logDone(t0.Add(2 * time.Second))
	if c.Running() {
		t.Fatal("running after its pod and its log ended")
	}
	if at, _ := c.Wait(); !at.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("ended at %s, want the log's end", at)
	}

	c = &container{done: make(chan struct{})}
	c.logDone(t0)
	if !c.Running() {
		t.Fatal("ended when only its log ended (a broken stream)")
	}
	c.seenGone(t0.Add(time.Second))
	if at, _ := c.Wait(); !at.Equal(t0.Add(time.Second)) {
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
	o := Options{Scenario: "chaos", StatefulSet: "kshard-system/kshard", Kubeconfig: "k", ChaosInterval: 20 * time.Second, Out: t.TempDir()}
	if err := o.setDefaults(scenarios["chaos"]); err != nil {
		t.Errorf("chaos on pods every 20s: %v", err)
	}
	o = Options{Scenario: "chaos", ChaosInterval: 20 * time.Second, Out: t.TempDir()}
	if err := o.setDefaults(scenarios["chaos"]); err == nil {
		t.Error("chaos on processes every 20s, below its 25s pause: accepted")
	}
}

// TestRestartFailsTheMemoryCheck: on pods, a replica container whose
// restart count grew during the run, or that the kernel OOM-killed during
// it, fails the memory check, which names the pod, its restarts and the
// reason; a deletion's termination and an OOM kill from before the run do
// not.
func TestRestartFailsTheMemoryCheck(t *testing.T) {
	begin := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	terminated := func(reason string, code int32, at time.Time) *corev1.ContainerStateTerminated {
		return &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code, FinishedAt: metav1.NewTime(at)}
	}
	running := corev1.ContainerStatus{Name: "kshard", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	oomBefore := running
	oomBefore.RestartCount = 1
	oomBefore.LastTerminationState.Terminated = terminated(oomKilled, 137, begin.Add(-time.Hour))
	restartedOOM := oomBefore
	restartedOOM.RestartCount = 2
	restartedOOM.LastTerminationState.Terminated = terminated(oomKilled, 137, begin.Add(time.Minute))
	crashed := running
	crashed.RestartCount = 1
	crashed.LastTerminationState.Terminated = terminated("Error", 2, begin.Add(time.Minute))
	killedNow := running // OOM-killed, its pod deleted before the restart
	killedNow.State = corev1.ContainerState{Terminated: terminated(oomKilled, 137, begin.Add(time.Minute))}
	deleted := running // a graceful deletion's SIGTERM
	deleted.State = corev1.ContainerState{Terminated: terminated("Error", 143, begin.Add(time.Minute))}

	for _, c := range []struct {
		name        string
		first, last corev1.ContainerStatus
		want        bool
		restarts    int32
		reason      string
	}{
		{"running throughout", running, running, false, 0, ""},
		{"an OOM kill from before the run", oomBefore, oomBefore, false, 0, ""},
		{"OOM-killed and restarted", oomBefore, restartedOOM, true, 1, "OOMKilled, exit code 137"},
		{"crashed and restarted", running, crashed, true, 1, "Error, exit code 2"},
		{"OOM-killed, not restarted yet", running, killedNow, true, 0, "OOMKilled, exit code 137"},
		{"deleted", running, deleted, false, 0, ""},
	} {
		r, got := restartOf("kshard-1", c.first, c.last, begin)
		if got != c.want || (got && (r.Restarts != c.restarts || r.Reason != c.reason || r.Pod != "kshard-1")) {
			t.Errorf("%s: %+v, %v; want %v with %d restarts, %q", c.name, r, got, c.want, c.restarts, c.reason)
		}
	}

	fleets := []*FleetResult{{Fleet: "sharded ×3", ReplicaFigures: []ReplicaFigures{{Replica: "kshard-0", Figures: []Figure{{Name: colRSSPeak, Value: 100 << 20}}}}}}
	r, _ := restartOf("kshard-1", oomBefore, restartedOOM, begin)
	c := memoryCheck(fleets, 512<<20, &containerRestarts{pods: 3, restarts: []podRestart{r}})
	if c.Passed || !strings.Contains(c.Detail, "pod kshard-1: 1 container restart (last termination: OOMKilled, exit code 137)") {
		t.Errorf("a restart: %+v, want a failure naming the pod, its restarts and the reason", c)
	}
	if c := memoryCheck(fleets, 512<<20, &containerRestarts{pods: 3}); !c.Passed || !strings.Contains(c.Detail, "no container of the 3 replica pods seen restarted") {
		t.Errorf("no restart: %+v, want a pass saying what was checked", c)
	}
	if c := memoryCheck(fleets, 512<<20, &containerRestarts{}); c.Passed || !c.NoData {
		t.Errorf("no pod seen: %+v, want no data", c)
	}
	// Without a memory limit the restarts are still checked.
	if c := memoryCheck(nil, 0, &containerRestarts{pods: 3, restarts: []podRestart{r}}); c.Passed || c.NotApplicable {
		t.Errorf("a restart without a memory limit: %+v, want a failure", c)
	}
}

// TestPodWatchKeepsFirstAndLastStatus: the pod watch keeps each pod's
// kshard container status as first and as last seen, by pod UID, so a
// pod's restarts count from the run's first sight of it and a recreated
// pod of the same name counts on its own.
func TestPodWatchKeepsFirstAndLastStatus(t *testing.T) {
	tgt := &podTarget{container: "kshard", byPod: map[types.UID]*container{}, byHolder: map[string]*container{}, changed: make(chan struct{}), seen: map[types.UID]*podSeen{}}
	pod := func(uid types.UID, restarts int32) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kshard-0", UID: uid},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "other", RestartCount: 9}, {Name: "kshard", RestartCount: restarts}}}}
	}
	ctx := context.Background()
	tgt.pod(ctx, pod("a", 2), false) // restarted before the run
	tgt.pod(ctx, pod("a", 3), false)
	tgt.pod(ctx, pod("a", 3), true)
	tgt.pod(ctx, pod("b", 0), false) // its successor
	n, rs := tgt.restarts(time.Now())
	if n != 2 || len(rs) != 1 || rs[0].Pod != "kshard-0" || rs[0].Restarts != 1 {
		t.Errorf("%d pods, restarts %+v; want 2 pods, kshard-0 restarted once", n, rs)
	}
}

// TestCopyLogResumesAfterTheLastLine: a log stream opened again from the
// last line's second repeats that second's lines; they are skipped, the
// timestamps stripped, and the holder found.
func TestCopyLogResumesAfterTheLastLine(t *testing.T) {
	tg := &podTarget{byHolder: map[string]*container{}}
	c := &container{pod: "kshard-1"}
	var out strings.Builder
	first := "2026-12-04T10:00:01.100000000Z {\"holder\":\"kshard-1_ab\",\"msg\":\"a\"}\n" +
		"2026-12-04T10:00:01.200000000Z {\"msg\":\"b\"}\n"
	last := tg.copyLog(c, strings.NewReader(first), &out, time.Time{})
	again := "2026-12-04T10:00:01.100000000Z {\"holder\":\"kshard-1_ab\",\"msg\":\"a\"}\n" +
		"2026-12-04T10:00:01.200000000Z {\"msg\":\"b\"}\n" +
		"2026-12-04T10:00:02.000000000Z {\"msg\":\"c\"}\n"
	tg.copyLog(c, strings.NewReader(again), &out, last)
	want := "{\"holder\":\"kshard-1_ab\",\"msg\":\"a\"}\n{\"msg\":\"b\"}\n{\"msg\":\"c\"}\n"
	if out.String() != want {
		t.Errorf("copied\n%s\nwant\n%s", out.String(), want)
	}
	if c.holder != "kshard-1_ab" || tg.byHolder["kshard-1_ab"] != c {
		t.Errorf("holder %q", c.holder)
	}
}
