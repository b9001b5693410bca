package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/sharding/lease"
)

// teamsNamespace holds the example's team ConfigMaps during its step.
const teamsNamespace = "e2e-teams"

// The example's labels and annotation (examples/teamdigest).
const (
	teamLabel        = "example.dev/team"
	teamShardLabel   = "teams.example.dev/shard"
	digestAnnotation = "example.dev/digest"
)

// testTeamDigest: the second user of the sharding library
// (examples/teamdigest) runs beside kshard on the node, as its deployment
// ships, with the fence `kshard fencing` wrote for its ring: two replicas
// become Ready, every team ConfigMap gets its digest and no other ConfigMap
// is touched, `kshard status` reads its ring (another ring, kind and label
// prefix), and a killed replica's teams are taken over.
func testTeamDigest(t *testing.T, s *suite, _ *recorder) {
	ctx := stepContext(t, 10*time.Minute)
	start := time.Now()
	// An earlier run's ConfigMaps and pods go first, so that the pods run
	// the image imported last. The fence stays: deleting a shard's Lease
	// before its binding would refuse everyone's writes to its objects.
	s.run(ctx, t, "delete", "namespace", teamsNamespace, "--ignore-not-found", "--wait=true", "--timeout=3m")
	s.run(ctx, t, "delete", "statefulset", "--namespace=team-digest", "team-digest", "--ignore-not-found", "--wait=true", "--timeout=3m")
	s.run(ctx, t, "apply", "--server-side", "-k", filepath.Join(s.repo, "e2e", "teamdigest"))
	s.run(ctx, t, "rollout", "status", "--namespace=team-digest", "statefulset/team-digest", "--timeout=5m")
	t.Logf("examples/teamdigest deployed, 2 replicas Ready after %s", time.Since(start).Round(time.Second))

	s.ensureNamespace(ctx, t, teamsNamespace)
	teams := map[string]bool{}
	for i := range 20 {
		name := fmt.Sprintf("settings-%02d", i)
		teams[name] = true
		s.put(ctx, t, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: teamsNamespace, Name: name, Labels: map[string]string{teamLabel: fmt.Sprintf("team-%d", i%5)}},
			Data:       map[string]string{"replicas": fmt.Sprint(i)},
		})
	}
	s.put(ctx, t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: teamsNamespace, Name: "not-a-team"}, Data: map[string]string{"a": "b"}})
	start = time.Now()
	digests := s.digested(ctx, t, teams, nil)
	t.Logf("20 team ConfigMaps digested after %s", time.Since(start).Round(time.Second))

	cmd := exec.CommandContext(ctx, s.kshard, "status", "--kubeconfig", os.Getenv(envKubeconfig), "--ring=team-digest",
		"--lease-namespace=team-digest", "--label-prefix=teams.example.dev", "--kind=ConfigMap.v1.")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ring team-digest: 16 shards, 0 unowned") {
		t.Fatalf("kshard status of the example's ring: %v\n%s", err, out)
	}

	// The replica holding the first team ConfigMap's shard force-deleted:
	// its teams are digested by the other (once its Leases expire) or by
	// its successor of the same name, whichever comes first.
	victim := s.teamHolder(ctx, t, "settings-00")
	s.run(ctx, t, "delete", "pod", "--namespace=team-digest", victim, "--grace-period=0", "--force")
	start = time.Now()
	for name := range teams {
		cm := &corev1.ConfigMap{}
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: teamsNamespace, Name: name}, cm); err != nil {
			t.Fatal(err)
		}
		cm.Data["replicas"] += "0"
		if err := s.c.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	s.digested(ctx, t, teams, digests)
	t.Logf("every team ConfigMap changed after %s (holder of settings-00's shard) was force-deleted digested again after %s", victim, time.Since(start).Round(time.Second))
	s.run(ctx, t, "delete", "namespace", teamsNamespace, "--wait=true", "--timeout=3m")
}

// digested waits until every ConfigMap of teams carries a digest (64 hex
// digits) other than its digest in before, and the others of the namespace
// carry nothing of the example's, and returns the digests.
func (s *suite) digested(ctx context.Context, t *testing.T, teams map[string]bool, before map[string]string) map[string]string {
	t.Helper()
	digests := map[string]string{}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var list corev1.ConfigMapList
		if last = s.c.List(ctx, &list, client.InNamespace(teamsNamespace)); last != nil {
			return false, nil
		}
		clear(digests)
		for _, cm := range list.Items {
			d := cm.Annotations[digestAnnotation]
			switch {
			case !teams[cm.Name] && (d != "" || cm.Labels[teamShardLabel] != ""):
				last = fmt.Errorf("%s, not a team's, was written: %v %v", cm.Name, cm.Labels, cm.Annotations)
				return false, last
			case teams[cm.Name] && (!hexDigest.MatchString(d) || d == before[cm.Name]):
				last = fmt.Errorf("%s: digest %q (before: %q)", cm.Name, d, before[cm.Name])
				return false, nil
			case teams[cm.Name]:
				digests[cm.Name] = d
			}
		}
		return len(digests) == len(teams), nil
	})
	if err != nil {
		t.Fatalf("waiting for the team ConfigMaps' digests: %v (%v)", err, last)
	}
	return digests
}

// teamHolder is the pod that holds the shard of the team ConfigMap name,
// from the shard's Lease (a holder identity is <pod>_<incarnation>).
func (s *suite) teamHolder(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: teamsNamespace, Name: name}, cm); err != nil {
		t.Fatal(err)
	}
	l := &coordinationv1.Lease{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: "team-digest", Name: lease.ShardName("team-digest", mustShard(t, cm.Labels[teamShardLabel]))}, l); err != nil {
		t.Fatal(err)
	}
	pod, _, ok := strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "_")
	if !ok {
		t.Fatalf("%s's shard %s is held by %q", name, cm.Labels[teamShardLabel], ptr.Deref(l.Spec.HolderIdentity, ""))
	}
	return pod
}

// mustShard reads a shard label.
func mustShard(t *testing.T, label string) int32 {
	t.Helper()
	n, err := strconv.ParseInt(label, 10, 32)
	if err != nil {
		t.Fatalf("shard label %q: %v", label, err)
	}
	return int32(n)
}

// hexDigest is a SHA-256 in hex.
var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)
