package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
	"github.com/kshard/kshard/sharding/ring"
)

// TestRealNode runs the end-to-end checks in order on one installation:
// each step starts from the state the previous one settled in, and a failed
// step ends the run (the later ones would only report its consequences).
func TestRealNode(t *testing.T) {
	s := newSuite(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	steps := []struct {
		name string
		run  func(*testing.T, *suite, *recorder)
	}{
		{"deploy", testDeploy},
		{"authorization", testAuthorization},
		{"teamdigest", testTeamDigest},
		{"scale", testScale},
		{"rollout-restart", testRolloutRestart},
		{"sigkill", testSIGKILL},
		{"unowned-alert", testUnownedAlert},
		{"faults", testFaults},
		{"hpa", testHPA},
		{"keda", testKEDA},
	}
	var rec *recorder
	for _, st := range steps {
		if !t.Run(st.name, func(t *testing.T) {
			if rec == nil && st.name != "deploy" {
				t.Fatal("no recorder: the deploy step did not run")
			}
			st.run(t, s, rec)
			if st.name == "deploy" {
				rec = newRecorder(ctx, t, s)
			}
		}) {
			t.FailNow()
		}
	}
	if !t.Run("audit", func(t *testing.T) { checkAudit(t, rec) }) {
		t.FailNow()
	}
	t.Run("loadtest", func(t *testing.T) { testLoadTester(t, s) })
}

// testDeploy: deploy/ as shipped plus the overlay applies, three replicas
// become Ready, 2,000 ConfigBindings become Ready, the node's Prometheus
// scrapes the replicas and the dashboard's main queries return data,
// `kshard status` shows every shard held.
func testDeploy(t *testing.T, s *suite, _ *recorder) {
	ctx := stepContext(t, 15*time.Minute)
	start := time.Now()
	// An earlier run's objects and installation go first, so that a run
	// installs from nothing and the pods run the image imported last.
	overlay := filepath.Join(s.repo, "e2e", "overlay")
	s.deleteObjects(ctx, t)
	s.run(ctx, t, "delete", "-k", filepath.Join(s.repo, "e2e", "hpa"), "--ignore-not-found", "--wait=true", "--timeout=5m")
	s.uninstallKeepingFencing(ctx, t, overlay)
	caPEM := s.installMetricsCert(ctx, t)
	s.installEtcdCerts(ctx, t)
	s.installSpiceDBToken(ctx, t)
	s.run(ctx, t, "apply", "--server-side", "-k", overlay)
	// The CRDs were deleted with an earlier installation and created again:
	// the API server serves them once they are established, and a client
	// whose REST mapper learnt them before would not find them.
	s.run(ctx, t, "wait", "--for=condition=Established", "crd/configbindings.config.kshard.dev", "--timeout=2m")
	var err error
	if s.c, err = client.New(s.cfg, client.Options{Scheme: replica.Scheme()}); err != nil {
		t.Fatal(err)
	}
	s.seedConfigEtcd(ctx, t)
	s.scaleTo(ctx, t, 3)
	t.Logf("deploy/node with the overlay applied, 3 replicas Ready and the ring settled after %s", time.Since(start).Round(time.Second))

	start = time.Now()
	s.createObjects(ctx, t)
	created := time.Since(start)
	s.settle(ctx, t, 3)
	t.Logf("%d ConfigBindings created in %s, all Ready after %s", objects, created.Round(time.Second), time.Since(start).Round(time.Second))

	s.installPrometheus(ctx, t, caPEM, 3)
	s.checkDashboard(ctx, t)

	cmd := exec.CommandContext(ctx, s.kshard, "status", "--kubeconfig", os.Getenv(envKubeconfig))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kshard status: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), fmt.Sprintf("%d shards, 0 unowned, 0 unlabeled objects", shards)) {
		t.Fatalf("kshard status does not show every shard held:\n%s", out)
	}
	t.Logf("kshard status:\n%s", out)
}

// testScale: kubectl scale 3 → 5 → 2. Shards move to and from the real
// pods, no shard is unowned longer than lease duration + retry period, the
// scaled-down pods exit within their grace period having released their
// shards, and every object ends Ready.
func testScale(t *testing.T, s *suite, rec *recorder) {
	ctx := stepContext(t, 15*time.Minute)
	ch := s.startChurn(ctx, 10)
	for _, to := range []int32{5, 2} {
		since := time.Now()
		s.run(ctx, t, "-n", systemNamespace, "scale", "statefulset", statefulSet, fmt.Sprintf("--replicas=%d", to))
		s.scaleTo(ctx, t, to)
		s.settle(ctx, t, to)
		t.Logf("scaled to %d: settled after %s", to, time.Since(since).Round(100*time.Millisecond))
		checkHandovers(t, rec, since, fmt.Sprintf("scale to %d", to))
		if to < 5 {
			checkExits(t, rec, since, int(5-to))
		}
	}
	t.Logf("%d updates during the scaling", ch.stop())
	s.settle(ctx, t, 2)
}

// testRolloutRestart: `kubectl rollout restart` restarts every pod; each
// ordinal takes its own shards back, so no shard moves to another replica.
func testRolloutRestart(t *testing.T, s *suite, rec *recorder) {
	ctx := stepContext(t, 15*time.Minute)
	s.run(ctx, t, "-n", systemNamespace, "scale", "statefulset", statefulSet, "--replicas=3")
	s.scaleTo(ctx, t, 3)
	s.settle(ctx, t, 3)
	before := rec.holders(time.Now())
	ch := s.startChurn(ctx, 10)
	since := time.Now()
	s.run(ctx, t, "-n", systemNamespace, "rollout", "restart", "statefulset/"+statefulSet)
	s.run(ctx, t, "-n", systemNamespace, "rollout", "status", "statefulset/"+statefulSet, "--timeout=10m")
	s.settle(ctx, t, 3)
	t.Logf("rollout restart settled after %s, %d updates meanwhile", time.Since(since).Round(100*time.Millisecond), ch.stop())

	moved := map[int32]string{}
	for n, tenures := range rec.tenures() {
		for _, x := range tenures {
			if !x.From.Before(since) && lease.HolderReplica(x.Holder) != before[n] {
				moved[n] = x.Holder
			}
		}
	}
	t.Logf("shards moved to another replica during the restart: %d (goal 0)", len(moved))
	if len(moved) > 0 {
		t.Errorf("shards held by another replica during the restart: %v (before: their holders %v)", moved, before)
	}
	checkHandovers(t, rec, since, "rollout restart")
	checkExits(t, rec, since, 3)
}

// testSIGKILL: a replica dies without a chance to hand over. Twice: its
// process is SIGKILLed (through the node's containerd; the kubelet restarts
// the container), and its pod is force-deleted (`kubectl delete pod
// --grace-period=0 --force`; the StatefulSet makes a new pod). Either way
// its shards are held again within lease duration + retry period of their
// last renewal, and the replica's next process takes them back.
func testSIGKILL(t *testing.T, s *suite, rec *recorder) {
	ctx := stepContext(t, 10*time.Minute)
	const victim = statefulSet + "-1"
	t.Run("process", func(t *testing.T) {
		sock := os.Getenv(envContainerd)
		if sock == "" {
			t.Skipf("%s is not set: the process cannot be killed through the node's containerd", envContainerd)
		}
		killed := s.killAndRecover(ctx, t, rec, victim, func() {
			id := rec.container(victim)
			id, ok := strings.CutPrefix(id, "containerd://")
			if !ok {
				t.Fatalf("%s runs no containerd container (%q)", victim, id)
			}
			if out, err := exec.CommandContext(ctx, "ctr", "--address", sock, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id).CombinedOutput(); err != nil {
				t.Fatalf("killing %s's container %s: %v\n%s", victim, id, err, out)
			}
		})
		// The survivors take the shards about a second after they
		// expire: the gauge may be up for less than a scrape, so the alert
		// is reported here, and made to go pending by unowned-alert.
		s.checkUnownedAlert(ctx, t, killed)
	})
	t.Run("pod", func(t *testing.T) {
		killed := s.killAndRecover(ctx, t, rec, victim, func() {
			s.run(ctx, t, "-n", systemNamespace, "delete", "pod", victim, "--grace-period=0", "--force")
		})
		s.checkUnownedAlert(ctx, t, killed)
	})
}

// killAndRecover kills the victim replica with kill, and checks that its
// shards are held again in time and that its next process takes them back.
func (s *suite) killAndRecover(ctx context.Context, t *testing.T, rec *recorder, victim string, kill func()) (killed time.Time) {
	t.Helper()
	theirs := rec.shardsOf(victim)
	if len(theirs) == 0 {
		t.Fatalf("%s holds no shard", victim)
	}
	ch := s.startChurn(ctx, 10)
	killed = time.Now()
	kill()
	renewed := map[int32]time.Time{}
	for _, n := range theirs {
		renewed[n] = rec.lastRenew(n)
	}
	// Held again: a tenure begun after the kill.
	next := func(n int32) (tenure, bool) { return rec.tenureAfter(n, killed, "") }
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		for _, n := range theirs {
			if _, ok := next(n); !ok {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the killed replica's %d shards were not all held again: %v", len(theirs), err)
	}
	bound := leaseDuration + retryPeriod
	var worst time.Duration
	by := map[string]int{}
	for _, n := range theirs {
		x, _ := next(n)
		gap := x.From.Sub(renewed[n])
		worst = max(worst, gap)
		by[lease.HolderReplica(x.Holder)]++
		// One more retry period allows for the acquirer's scheduling on a
		// loaded node; the figure is reported against the bound itself.
		if gap > bound+retryPeriod {
			t.Errorf("shard %d held again by %s %s after its killed holder's last renewal, bound %s", n, x.Holder, gap.Round(10*time.Millisecond), bound)
		}
	}
	t.Logf("%s's %d shards held again (by %v) at most %s after their last renewal (lease duration + retry period: %s), all %s after the kill",
		victim, len(theirs), by, worst.Round(10*time.Millisecond), bound, time.Since(killed).Round(100*time.Millisecond))
	s.scaleTo(ctx, t, 3)
	s.settle(ctx, t, 3)
	back := 0
	for _, n := range theirs {
		if rec.holders(time.Now())[n] == victim {
			back++
		}
	}
	t.Logf("%s's next process holds %d of its %d shards again, %s after the kill; %d updates meanwhile", victim, back, len(theirs),
		time.Since(killed).Round(100*time.Millisecond), ch.stop())
	if back != len(theirs) {
		t.Errorf("%s's next process holds %d of its %d shards", victim, back, len(theirs))
	}
	return killed
}

// testHPA: kube-controller-manager's HPA controller scales the StatefulSet
// on kshard_objects_held, which reaches it through the custom metrics API
// from kshard-metrics-adapter (deploy/autoscaling-adapter, with e2e/hpa's
// shorter windows and lower target): up while the objects per replica exceed
// the target, and down, after the stabilization window, once they do not.
func testHPA(t *testing.T, s *suite, rec *recorder) {
	ctx := stepContext(t, 20*time.Minute)
	hpa := filepath.Join(s.repo, "e2e", "hpa")
	t.Cleanup(func() {
		// The StatefulSet is the suite's again, whatever happened.
		_, _ = s.runErr(context.Background(), "delete", "-k", hpa, "--ignore-not-found", "--wait=true", "--timeout=5m")
	})
	applied := time.Now()
	s.run(ctx, t, "apply", "--server-side", "-k", hpa)
	s.run(ctx, t, "-n", systemNamespace, "rollout", "status", "deployment/kshard-metrics-adapter", "--timeout=5m")
	s.run(ctx, t, "wait", "apiservice/v1beta2.custom.metrics.k8s.io", "--for=condition=Available", "--timeout=5m")

	// The metric as the HPA controller asks for it: every replica pod's
	// objects, adding up to all of them.
	var held map[string]int64
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		held, err = s.objectsHeld(ctx)
		if err != nil {
			return false, nil
		}
		var sum int64
		for _, v := range held {
			sum += v
		}
		return len(held) == 3 && sum == objects, nil
	})
	if err != nil {
		t.Fatalf("custom metrics API: kshard_objects_held %v, want 3 pods adding up to %d: %v", held, objects, err)
	}
	t.Logf("custom metrics API, %s after the apply: kshard_objects_held %v", time.Since(applied).Round(time.Second), held)

	s.autoscale(ctx, t, rec, statefulSet, objectNamespaces/2, time.Now(), "the metric was served")
}

// autoscale: the HPA named hpa sets the StatefulSet, at 3 replicas, to 5 on
// the objects there, and back to 3, the minimum, after the namespaces from
// keep on are deleted; each time the ring settles, every shard handed over
// with a release, and the two pods that go exit cleanly. The times are
// reported from since, when what happened.
func (s *suite) autoscale(ctx context.Context, t *testing.T, rec *recorder, hpa string, keep int, since time.Time, what string) {
	t.Helper()
	s.waitDesired(ctx, t, hpa, 5)
	t.Logf("the HPA scaled the StatefulSet to 5 replicas %s after %s: %s", time.Since(since).Round(time.Second), what, s.hpaStatus(ctx, hpa))
	s.scaleTo(ctx, t, 5)
	s.settle(ctx, t, 5)
	t.Logf("ring of 5 settled %s after %s", time.Since(since).Round(time.Second), what)
	checkHandovers(t, rec, since, hpa+" scale up")

	since = time.Now()
	for i := keep; i < objectNamespaces; i++ {
		s.run(ctx, t, "delete", "namespace", objectNamespace(i), "--wait=true", "--timeout=5m", "--ignore-not-found")
	}
	deleted := time.Now()
	s.waitDesired(ctx, t, hpa, 3)
	t.Logf("objects deleted in %s; the HPA scaled the StatefulSet to 3 replicas %s after the deletion (stabilization window 30 s): %s",
		deleted.Sub(since).Round(time.Second), time.Since(deleted).Round(time.Second), s.hpaStatus(ctx, hpa))
	s.scaleTo(ctx, t, 3)
	s.settle(ctx, t, 3)
	checkHandovers(t, rec, since, hpa+" scale down")
	checkExits(t, rec, since, 2)
}

// objectsHeld reads kshard_objects_held of the replica pods through the
// custom metrics API.
func (s *suite) objectsHeld(ctx context.Context) (map[string]int64, error) {
	raw, err := s.cs.Discovery().RESTClient().Get().
		AbsPath("/apis/custom.metrics.k8s.io/v1beta2/namespaces", systemNamespace, "pods", "*", "kshard_objects_held").
		Param("labelSelector", podSelector).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var list struct {
		Items []struct {
			DescribedObject struct {
				Name string `json:"name"`
			} `json:"describedObject"`
			Value resource.Quantity `json:"value"`
		} `json:"items"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("decoding the custom metrics API's answer: %w", err)
	}
	out := map[string]int64{}
	for _, x := range list.Items {
		out[x.DescribedObject.Name] = x.Value.Value()
	}
	return out, nil
}

// waitDesired waits until the HPA named hpa has set the StatefulSet's
// replicas to want.
func (s *suite) waitDesired(ctx context.Context, t *testing.T, hpa string, want int32) {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		var sts appsv1.StatefulSet
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: statefulSet}, &sts); err != nil {
			return false, nil
		}
		return ptr.Deref(sts.Spec.Replicas, 0) == want, nil
	})
	if err != nil {
		t.Fatalf("the HPA did not set %d replicas: %v; %s", want, err, s.hpaStatus(context.Background(), hpa))
	}
}

// hpaStatus is the current metric, desired replicas and conditions of the
// HPA named name.
func (s *suite) hpaStatus(ctx context.Context, name string) string {
	out, err := s.runErr(ctx, "-n", systemNamespace, "get", "hpa", name, "-o",
		`jsonpath=current {.status.currentMetrics[0]}, desired {.status.desiredReplicas}, {range .status.conditions[*]}{.type}={.status} ({.reason}) {end}`)
	if err != nil {
		return err.Error()
	}
	return out
}

// checkAudit: over the whole run, no two replicas reconciled one object at
// the same time (the pods' audit records), and the API server committed no
// write to a shard's objects outside its writer's tenure of the shard's
// Lease (the node's kube-apiserver audit log, internal/audit.CheckExclusive).
func checkAudit(t *testing.T, rec *recorder) {
	d, processes := rec.auditLog()
	overlaps := audit.Overlaps(d.ByObject)
	t.Logf("audit: %d records of %d objects from %d replica processes; %d overlapping reconciles", d.Records, len(d.ByObject), processes, len(overlaps))
	if d.Records == 0 {
		t.Error("no audit records read from the pods' logs: the reconcile check would prove nothing")
	}
	for i, o := range overlaps {
		if i == 5 {
			break
		}
		t.Errorf("overlapping reconciles: %s", o)
	}

	path := os.Getenv(envAPIServerAudit)
	if path == "" {
		t.Errorf("no API-server evidence: %s is not set (make e2e sets it to the node's kube-apiserver audit log), so no write was checked against the shard Leases", envAPIServerAudit)
		return
	}
	l, err := audit.ReadAPILogFile(path)
	if err != nil {
		t.Errorf("no API-server evidence: %v (a cluster started before make cluster wrote an audit log? restart it)", err)
		return
	}
	e := audit.CheckExclusive(l, audit.CheckOptions{Ring: ringName, LeaseNamespace: systemNamespace, ShardTable: replica.DefaultShardTable,
		ReplicaUsers: []string{"system:serviceaccount:" + systemNamespace + ":" + serviceAccount}})
	t.Logf("the API server's audit log (%d events): %s", l.Events, e)
	if e.Writes() == 0 || e.LeaseWrites == 0 {
		t.Errorf("no API-server evidence: the audit log %s shows %d replica writes and %d shard Lease writes, so the check would prove nothing", path, e.Writes(), e.LeaseWrites)
	}
	if !e.OK() {
		t.Errorf("writes committed outside their writer's tenure, or unattributed:\n%s", e)
	}
}

// checkHandovers: every shard handed over since since was released by its
// holder (none had to expire) and had no holder for at most lease duration
// + retry period.
func checkHandovers(t *testing.T, rec *recorder, since time.Time, what string) {
	t.Helper()
	gaps := rec.handovers(since)
	var worst time.Duration
	for _, g := range gaps {
		worst = max(worst, g.Gap)
		if !g.Released {
			t.Errorf("%s: shard %d taken over by %s from %s without a release", what, g.Shard, g.To, g.From)
		}
		if g.Gap > leaseDuration+retryPeriod {
			t.Errorf("%s: shard %d unowned for %s, more than lease duration + retry period", what, g.Shard, g.Gap)
		}
	}
	t.Logf("%s: %d handovers, each released; longest without a holder %s", what, len(gaps), worst.Round(time.Millisecond))
}

// checkExits: the want pods deleted since since exited with code 0 within
// their termination grace period.
func checkExits(t *testing.T, rec *recorder, since time.Time, want int) {
	t.Helper()
	pods := rec.deleted(since)
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	if len(pods) != want {
		t.Errorf("%d pods deleted, want %d", len(pods), want)
	}
	for _, p := range pods {
		took := p.Gone.Sub(p.DeleteRequested)
		exit := "no exit seen"
		if p.Exit != nil {
			took = p.Exit.FinishedAt.Sub(p.DeleteRequested)
			exit = fmt.Sprintf("exit code %d (%s)", p.Exit.ExitCode, p.Exit.Reason)
		}
		t.Logf("%s: %s, %s after its deletion (grace %s)", p.Name, exit, took.Round(100*time.Millisecond), p.Grace)
		if p.Exit != nil && p.Exit.ExitCode != 0 {
			t.Errorf("%s exited with %s", p.Name, exit)
		}
		if p.Gone.IsZero() || took > p.Grace {
			t.Errorf("%s did not exit within its grace period %s: %s", p.Name, p.Grace, took)
		}
	}
}

// scaleTo waits until the StatefulSet has want Ready replicas, all of the
// current revision, and no other replica pod.
func (s *suite) scaleTo(ctx context.Context, t *testing.T, want int32) {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		var sts appsv1.StatefulSet
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: systemNamespace, Name: statefulSet}, &sts); err != nil {
			return false, nil
		}
		st := sts.Status
		if ptr.Deref(sts.Spec.Replicas, 0) != want || st.ObservedGeneration != sts.Generation || st.ReadyReplicas != want ||
			st.Replicas != want || st.UpdatedReplicas != want {
			return false, nil
		}
		pods, err := s.cs.CoreV1().Pods(systemNamespace).List(ctx, metav1.ListOptions{LabelSelector: podSelector})
		return err == nil && len(pods.Items) == int(want), nil
	})
	if err != nil {
		out, _ := s.runErr(context.Background(), "-n", systemNamespace, "get", "statefulset,pods", "-o", "wide")
		t.Fatalf("statefulset %s not at %d Ready replicas: %v\n%s", statefulSet, want, err, out)
	}
}

// settle waits until the ring is what want replicas make it — every shard
// held by its desired owner among live members kshard-0..want-1, nothing
// unlabelled — and every object is Ready for its current generation.
func (s *suite) settle(ctx context.Context, t *testing.T, want int32) {
	t.Helper()
	var members []string
	for i := range want {
		members = append(members, fmt.Sprintf("%s-%d", statefulSet, i))
	}
	var why string
	err := wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		st, err := ring.ReadStatus(ctx, s.c, ring.StatusOptions{Namespace: systemNamespace, Ring: ringName, Kind: configv1alpha1.GroupVersion.WithKind("ConfigBinding"), LabelPrefix: sharding.DefaultLabelPrefix})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		var live []string
		for _, m := range st.Members {
			if m.Live {
				live = append(live, m.Name)
			}
		}
		switch {
		case !slices.Equal(live, members):
			why = fmt.Sprintf("live members %v, want %v", live, members)
			return false, nil
		case len(st.Unowned) > 0:
			why = fmt.Sprintf("%d shards unowned", len(st.Unowned))
			return false, nil
		case st.Unlabeled > 0:
			why = fmt.Sprintf("%d objects unlabelled", st.Unlabeled)
			return false, nil
		}
		for _, sh := range st.Shards {
			if sh.Holder != sh.Desired {
				why = fmt.Sprintf("shard %d held by %s, desired %s", sh.Shard, sh.Holder, sh.Desired)
				return false, nil
			}
		}
		n, example, err := s.notReady(ctx)
		if err != nil || n > 0 {
			why = fmt.Sprintf("%d objects not Ready (%s) %v", n, example, err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("ring of %d replicas not settled: %s: %v", want, why, err)
	}
}

// admissionPolicy matches a manifest of an admission policy or its binding.
var admissionPolicy = regexp.MustCompile(`(?m)^kind: (Validating|Mutating)AdmissionPolicy(Binding)?$`)

// uninstallKeepingFencing deletes an earlier installation but its admission
// policies and their bindings (the fencing policy's Leases, the label
// policy's shard table). kube-apiserver (1.37.2 here) stops the informer of a
// built-in paramKind for good once no binding names it, and the policy then
// reads the params it last saw: after a reinstall the fencing policy denied
// every write of a shard's new holder, naming the previous installation's
// holder, until kube-apiserver was restarted (kubernetes/kubernetes#130887).
// The same policies and bindings are applied again, unchanged.
func (s *suite) uninstallKeepingFencing(ctx context.Context, t *testing.T, overlay string) {
	t.Helper()
	var keep []string
	for _, doc := range strings.Split(s.run(ctx, t, "kustomize", overlay), "\n---\n") {
		if admissionPolicy.MatchString(doc) {
			continue
		}
		keep = append(keep, doc)
	}
	path := filepath.Join(t.TempDir(), "installation.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(keep, "\n---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	s.run(ctx, t, "delete", "-f", path, "--ignore-not-found", "--wait=true", "--timeout=5m")
}
