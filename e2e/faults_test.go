package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
)

// envFault is hack/cluster/fault.sh, through which the suite restarts the
// node's kube-apiserver and etcd and cuts a pod's network; make e2e sets it.
const envFault = "KSHARD_E2E_FAULT"

// testFaults: faults of the infrastructure while updates flow. A replica's
// network is cut (its pod's veth down) for longer than a lease and then
// restored; the kube-apiserver is restarted; etcd is restarted. After each,
// by the node's kube-apiserver audit log: no write committed outside its
// writer's tenure (the cut replica's held writes arrive late: the
// shard-writes policy refuses them), every latest generation Ready, and each
// replica process's informers relisted at most once (once more for a cache
// started after an acquisition).
func testFaults(t *testing.T, s *suite, rec *recorder) {
	script, auditPath := os.Getenv(envFault), os.Getenv(envAPIServerAudit)
	if script == "" || auditPath == "" {
		t.Skipf("%s or %s is not set: the faults cannot be injected or checked (make e2e sets both)", envFault, envAPIServerAudit)
	}
	ctx := stepContext(t, 30*time.Minute)
	fault := func(t *testing.T, args ...string) {
		t.Helper()
		out, err := exec.CommandContext(ctx, script, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, out)
		}
		t.Logf("fault.sh %s: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}
	t.Run("partition", func(t *testing.T) {
		const victim = statefulSet + "-1"
		id := rec.container(victim)
		if id == "" {
			t.Fatalf("%s runs no container", victim)
		}
		theirs := rec.shardsOf(victim)
		if len(theirs) == 0 {
			t.Fatalf("%s holds no shard", victim)
		}
		s.underFault(ctx, t, auditPath, func() {
			cut := time.Now()
			fault(t, "veth", "down", id)
			// Longer than a lease: the others take its shards over, and
			// what it sent meanwhile arrives after they did.
			time.Sleep(leaseDuration + 2*retryPeriod)
			var taken []int32
			for _, n := range theirs {
				if _, ok := rec.tenureAfter(n, cut, victim); ok {
					taken = append(taken, n)
				}
			}
			if len(taken) > 0 {
				s.fenceRefuses(ctx, t, victim, taken)
			}
			fault(t, "veth", "up", id)
			// The cut is real only if the others noticed it.
			t.Logf("while %s was cut off, the others took %d of its %d shards", victim, len(taken), len(theirs))
			if len(taken) == 0 {
				t.Errorf("no shard of %s was taken over while its network was cut: the cut did not happen", victim)
			}
		})
	})
	t.Run("kube-apiserver-restart", func(t *testing.T) {
		s.underFault(ctx, t, auditPath, func() {
			fault(t, "restart", "kube-apiserver")
			s.waitAPIServer(ctx, t)
		})
	})
	t.Run("etcd-restart", func(t *testing.T) {
		s.underFault(ctx, t, auditPath, func() {
			fault(t, "restart", "etcd")
			s.waitAPIServer(ctx, t)
		})
	})
}

// underFault injects a fault while objects change, waits until the ring
// and every object settled again, and checks the API server's audit log:
// exclusive writes over the whole run, and the relists since the fault.
func (s *suite) underFault(ctx context.Context, t *testing.T, auditPath string, inject func()) {
	t.Helper()
	ch := s.startChurn(ctx, 10)
	from := time.Now()
	inject()
	injected := time.Since(from)
	// Updates go on while the replicas recover.
	time.Sleep(2 * retryPeriod)
	updates := ch.stop()
	s.scaleTo(ctx, t, 3)
	s.settle(ctx, t, 3)
	to := time.Now()
	t.Logf("fault over %s after it began; ring and every object's latest generation settled %s after it; %d updates meanwhile",
		injected.Round(100*time.Millisecond), to.Sub(from).Round(100*time.Millisecond), updates)

	l, err := audit.ReadAPILogFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	e := audit.CheckExclusive(l, audit.CheckOptions{Ring: ringName, LeaseNamespace: systemNamespace, ShardTable: replica.DefaultShardTable,
		ReplicaUsers: []string{"system:serviceaccount:" + systemNamespace + ":" + serviceAccount}})
	t.Logf("the API server's audit log: %s", e)
	if !e.OK() {
		t.Errorf("writes committed outside their writer's tenure, or unattributed:\n%s", e)
	}
	if e.Writes() == 0 || e.LeaseWrites == 0 {
		t.Errorf("no API-server evidence: %d replica writes, %d shard Lease writes in %s", e.Writes(), e.LeaseWrites, auditPath)
	}
	before := 0
	for _, sy := range l.Syncs {
		if sy.Holder != "" && sy.Received.Before(from) {
			before++
		}
	}
	if before == 0 {
		t.Fatalf("the audit log %s shows no replica's initial sync before the fault: relists cannot be counted (a cluster started before its audit policy logged LISTs and watches? restart it)", auditPath)
	}
	r := audit.CheckRelists(l, audit.RelistOptions{Ring: ringName, LeaseNamespace: systemNamespace, From: from, To: to})
	t.Logf("relists: %s", r)
	if !r.OK() {
		t.Errorf("informers relisted more than once:\n%s", r)
	}
}

// fenceRefuses writes, as pod victim (a token bound to it, as its process
// holds), to a ConfigMap of one of the shards another replica took from it: what
// the cut replica's writes are when they arrive late. The API server must
// refuse it with the fence's message. A dry run: admission decides it as
// it would the real write, and nothing is committed. It reports with
// t.Errorf, never t.Fatal: the caller brings the victim's network back.
func (s *suite) fenceRefuses(ctx context.Context, t *testing.T, victim string, taken []int32) {
	t.Helper()
	cm, err := s.lateWrite(ctx, victim, taken)
	if err != nil {
		t.Errorf("a write as %s to a shard another replica took from it: %v", victim, err)
		return
	}
	t.Logf("a write as %s to ConfigMap %s/%s of shard %s after its takeover was refused by the fence", victim, cm.Namespace, cm.Name, cm.Labels[sharding.LabelShard])
}

// lateWrite is fenceRefuses' write, to a ConfigMap of the first of taken
// that has one (some shards hold no object): nil when the fence refused it.
func (s *suite) lateWrite(ctx context.Context, victim string, taken []int32) (*corev1.ConfigMap, error) {
	pod, err := s.cs.CoreV1().Pods(systemNamespace).Get(ctx, victim, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	tr, err := s.cs.CoreV1().ServiceAccounts(systemNamespace).CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	cfg := rest.AnonymousClientConfig(s.cfg)
	cfg.BearerToken = tr.Status.Token
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	for _, n := range taken {
		// No limit: a limited list with a label selector may answer a
		// page with no item.
		var cms corev1.ConfigMapList
		if err := s.c.List(ctx, &cms, client.MatchingLabels{sharding.LabelShard: strconv.Itoa(int(n))}); err != nil {
			return nil, err
		}
		if len(cms.Items) == 0 {
			continue
		}
		cm := &cms.Items[0]
		_, err = as.CoreV1().ConfigMaps(cm.Namespace).Patch(ctx, cm.Name, types.MergePatchType, []byte(`{"data":{"late":"write"}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "kshard fencing") {
			return cm, fmt.Errorf("ConfigMap %s/%s of shard %d: got %v, want the fence's refusal", cm.Namespace, cm.Name, n, err)
		}
		return cm, nil
	}
	return nil, fmt.Errorf("no ConfigMap in the shards taken from it, %v", taken)
}

// waitAPIServer waits until the API server answers /readyz again.
func (s *suite) waitAPIServer(ctx context.Context, t *testing.T) {
	t.Helper()
	// The restart is node.sh's: let it begin before asking.
	time.Sleep(2 * time.Second)
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		body, err := s.cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
	if err != nil {
		t.Fatalf("the API server did not answer /readyz again: %v", err)
	}
}
