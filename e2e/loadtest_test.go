package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kshard/kshard/loadtest"
)

// testLoadTester: the load tester runs its basic scenario on the pods of
// the installed StatefulSet (`loadtest --statefulset`), which it did not
// start: it scales them, follows their logs and reads their metrics, and
// every check of its report passes. Last, because it resizes the
// StatefulSet and reseeds the config center; the HPA goes first, or it
// would resize the StatefulSet under the load tester.
func testLoadTester(t *testing.T, s *suite) {
	ctx := stepContext(t, 15*time.Minute)
	// The load tester's clients log through controller-runtime's logger.
	ctrl.SetLogger(logr.Discard())
	s.run(ctx, t, "delete", "-k", filepath.Join(s.repo, "e2e", "hpa"), "--ignore-not-found", "--wait=true", "--timeout=5m")
	// An earlier run's objects would be refused as leftovers.
	if err := s.cs.CoreV1().Namespaces().Delete(ctx, loadtest.Namespace, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := s.cs.CoreV1().Namespaces().Get(ctx, loadtest.Namespace, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("namespace %s of an earlier run not gone: %v", loadtest.Namespace, err)
	}
	rep, err := loadtest.Run(ctx, loadtest.Options{
		Scenario: "basic", Kubeconfig: s.kubeconfig, StatefulSet: systemNamespace + "/" + statefulSet,
		APIServerAuditLog: os.Getenv(envAPIServerAudit),
		Objects:           300, Duration: 20 * time.Second, CalibrateFor: -1,
		Out: t.TempDir(), WorkDir: t.TempDir(), Progress: logWriter{t},
	})
	if err != nil {
		t.Fatalf("loadtest --statefulset: %v", err)
	}
	for _, c := range rep.Checks {
		if !c.Passed {
			t.Errorf("loadtest check failed: %s: %s", c.Name, c.Detail)
		}
	}
	if len(rep.Fleets) != 1 {
		t.Fatalf("%d fleets; want one", len(rep.Fleets))
	}
	// Every figure came from the run's Prometheus, which scraped the pods
	// over HTTPS with the load tester's token: none may lack data but those
	// of a service it does not scrape on a cluster (the node's etcd), a
	// span the run did not have, or a ratio to a ceiling it did not
	// calibrate.
	figures := map[string]loadtest.Figure{}
	for _, x := range rep.Fleets[0].Figures {
		figures[x.Name] = x
		if x.NoData != "" && x.NoData != "no objects" && !strings.HasPrefix(x.NoData, "n/a: ") && !strings.HasPrefix(x.NoData, "not scraped: ") && !strings.HasPrefix(x.NoData, "the fleet had no ") {
			t.Errorf("figure %q: %s: %s", x.Name, x.NoData, x.Query)
		}
	}
	if n := figures["replica processes (restarts included)"]; n.NoData != "" || n.Value != 3 {
		t.Errorf("replica processes %v (%s); want the 3 pods' containers", n.Value, n.NoData)
	}
	p99 := figures["end-to-end p99"]
	t.Logf("loadtest basic on the pods: %d checks passed; end-to-end p99 %.3f s", len(rep.Checks), p99.Value)
}

// logWriter sends the load tester's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
