package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/authzcache/spicedbsource"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/spicedbserver"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// spiceDBToken is the Secret holding deploy/spicedb's preshared key, which
// the SpiceDB and the replicas mount.
const spiceDBToken = "kshard-spicedb-token"

// intruder is a namespace deploy/node's grants (spicedb-grants.yaml) leave
// out: it reads no domain until the suite grants it one.
const intruder = "e2e-intruder"

// installSpiceDBToken makes SpiceDB's preshared key as a user of the node
// does, once: a random token in Secret kshard-spicedb-token.
func (s *suite) installSpiceDBToken(ctx context.Context, t *testing.T) {
	t.Helper()
	s.ensureNamespace(ctx, t, systemNamespace)
	_, err := s.cs.CoreV1().Secrets(systemNamespace).Get(ctx, spiceDBToken, metav1.GetOptions{})
	if err == nil {
		return
	}
	if !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: spiceDBToken},
		StringData: map[string]string{"token": hex.EncodeToString(b)}}
	if _, err := s.cs.CoreV1().Secrets(systemNamespace).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// spiceDBGrants connects to deploy/spicedb's SpiceDB through its Service,
// with the key of its Secret, as a user's zed would.
func (s *suite) spiceDBGrants(ctx context.Context, t *testing.T) *spicedbserver.Grants {
	t.Helper()
	s.run(ctx, t, "-n", systemNamespace, "rollout", "status", "deployment/spicedb", "--timeout=5m")
	svc, err := s.cs.CoreV1().Services(systemNamespace).Get(ctx, "spicedb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec, err := s.cs.CoreV1().Secrets(systemNamespace).Get(ctx, spiceDBToken, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, sec.Data["token"], 0o600); err != nil {
		t.Fatal(err)
	}
	port := int32(0)
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			port = p.Port
		}
	}
	g, err := spicedbserver.Dial(spicedbsource.ClientOptions{
		Endpoint: net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(port))), TokenFile: tokenFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// testAuthorization: the replicas of deploy/node ask its SpiceDB. A
// binding in a namespace the node's grants leave out says Forbidden and
// its ConfigMap holds no value; a direct grant makes it Ready with its
// value, without a restart; the grant moved to a team keeps it Ready; the
// namespace removed from the team (no relationship of the domain changes)
// makes it Forbidden again and takes the value out of its ConfigMap. The
// namespace goes at the end: the steps after this one count the suite's
// objects.
func testAuthorization(t *testing.T, s *suite, _ *recorder) {
	ctx := stepContext(t, 10*time.Minute)
	g := s.spiceDBGrants(ctx, t)
	domain, key := configcenter.SeedDomain(0), configcenter.SeedKey(0)
	direct := "configdomain:" + domain + "#reader@kubernetes/namespace:" + intruder
	teamReads := "configdomain:" + domain + "#reader@team:e2e-intruders#member"
	member := "team:e2e-intruders#member@kubernetes/namespace:" + intruder
	// An earlier run's grants and objects go first.
	if err := g.Delete(ctx, direct, teamReads, member); err != nil {
		t.Fatal(err)
	}
	if err := s.cs.CoreV1().Namespaces().Delete(ctx, intruder, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := s.cs.CoreV1().Namespaces().Get(ctx, intruder, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("namespace %s of an earlier run not gone: %v", intruder, err)
	}
	s.put(ctx, t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: intruder, Labels: map[string]string{"kshard.dev/targets": "enabled"}}})
	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: intruder, Name: "copied"},
		Spec: configv1alpha1.ConfigBindingSpec{
			Domain: domain, Keys: []configv1alpha1.ConfigKey{configv1alpha1.ConfigKey(key)},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "copied-config"},
		},
	}
	if err := s.c.Create(ctx, cb); err != nil {
		t.Fatal(err)
	}
	s.bindingIs(ctx, t, cb, false, "no grant")

	if err := g.Touch(ctx, direct); err != nil {
		t.Fatal(err)
	}
	s.bindingIs(ctx, t, cb, true, "a direct grant")

	if err := g.Touch(ctx, teamReads, member); err != nil {
		t.Fatal(err)
	}
	if err := g.Delete(ctx, direct); err != nil {
		t.Fatal(err)
	}
	s.bindingIs(ctx, t, cb, true, "the grant through team e2e-intruders")

	revoked := time.Now()
	if err := g.Delete(ctx, member); err != nil {
		t.Fatal(err)
	}
	s.bindingIs(ctx, t, cb, false, "removed from the team")
	t.Logf("the namespace removed from its team: Forbidden and the value gone from its ConfigMap %s later", time.Since(revoked).Round(10*time.Millisecond))

	// The steps after this one count the suite's objects: this one's go.
	s.run(ctx, t, "delete", "namespace", intruder, "--wait=true", "--timeout=5m")
	if err := g.Delete(ctx, teamReads); err != nil {
		t.Fatal(err)
	}
}

// bindingIs waits until cb says Ready (allowed) with its value in its
// ConfigMap, or Forbidden with none.
func (s *suite) bindingIs(ctx context.Context, t *testing.T, cb *configv1alpha1.ConfigBinding, allowed bool, after string) {
	t.Helper()
	key := string(cb.Spec.Keys[0])
	last := ""
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var got configv1alpha1.ConfigBinding
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(cb), &got); err != nil {
			return false, err
		}
		ready := meta.FindStatusCondition(got.Status.Conditions, configbinding.ConditionReady)
		var cm corev1.ConfigMap
		err := s.c.Get(ctx, client.ObjectKey{Namespace: cb.Namespace, Name: cb.Spec.Target.ConfigMapName}, &cm)
		if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		value, has := cm.Data[key]
		if ready != nil {
			last = fmt.Sprintf("Ready=%s reason %s (%s); ConfigMap value %q", ready.Status, ready.Reason, ready.Message, value)
		}
		if allowed {
			return ready != nil && ready.Status == metav1.ConditionTrue && ready.ObservedGeneration == got.Generation && has && value != "", nil
		}
		return ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == configbinding.ReasonForbidden && !has, nil
	})
	if err != nil {
		t.Fatalf("after %s, binding %s/%s is not %s: %v; last: %s", after, cb.Namespace, cb.Name, map[bool]string{true: "Ready with its value", false: "Forbidden with no value"}[allowed], err, last)
	}
	t.Logf("after %s: %s", after, last)
}
