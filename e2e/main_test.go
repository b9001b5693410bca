package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
)

// What the suite runs against, and how the shipped manifests name things.
const (
	// envKubeconfig names the cluster; make e2e sets it to make cluster's.
	envKubeconfig = "KSHARD_E2E_KUBECONFIG"
	// envKubectl overrides the kubectl the suite runs (default: the v1.37.2
	// one make cluster builds into bin/node).
	envKubectl = "KSHARD_E2E_KUBECTL"
	// envContainerd is the node's containerd socket, through which the
	// suite SIGKILLs a replica's process.
	envContainerd = "KSHARD_E2E_CONTAINERD"
	// envAPIServerAudit is the node's kube-apiserver audit log (make
	// cluster writes it under internal/audit's policy): the API server's
	// own record of the writes it committed, which the write check reads.
	envAPIServerAudit = "KSHARD_E2E_APISERVER_AUDIT"

	systemNamespace = "kshard-system"
	statefulSet     = "kshard"
	serviceAccount  = "kshard"
	ringName        = "kshard"
	shards          = sharding.DefaultShards
	podSelector     = "app.kubernetes.io/name=kshard"

	// leaseDuration and retryPeriod are the replicas' (deploy/base sets
	// neither, so the defaults): a shard is unowned for at most their sum.
	leaseDuration = sharding.DefaultLeaseDuration
	retryPeriod   = sharding.DefaultRetryPeriod
)

// suite is the cluster and what the tests share of it.
type suite struct {
	repo    string
	kubectl string
	cfg     *rest.Config
	cs      kubernetes.Interface
	c       client.Client
	// kshard is the kshard binary built for this run (`kshard status`).
	kshard string
	// kubeconfig is the cluster's, for the load tester.
	kubeconfig string
}

func newSuite(t *testing.T) *suite {
	t.Helper()
	kubeconfig := os.Getenv(envKubeconfig)
	if kubeconfig == "" {
		t.Skipf("%s is not set: the end-to-end suite needs the cluster of `make cluster` (run `make e2e`)", envKubeconfig)
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	s := &suite{repo: repo, kubectl: os.Getenv(envKubectl), kubeconfig: kubeconfig}
	if s.kubectl == "" {
		s.kubectl = filepath.Join(repo, "bin", "node", "kubectl")
	}
	s.cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("loading %s: %v", kubeconfig, err)
	}
	s.cfg.QPS, s.cfg.Burst = 200, 400
	if s.cs, err = kubernetes.NewForConfig(s.cfg); err != nil {
		t.Fatal(err)
	}
	if s.c, err = client.New(s.cfg, client.Options{Scheme: replica.Scheme()}); err != nil {
		t.Fatal(err)
	}
	bins, err := childproc.Build(context.Background(), repo, filepath.Join(repo, "bin", "test", "children", "e2e"), "kshard")
	if err != nil {
		t.Fatal(err)
	}
	s.kshard = bins[0]
	return s
}

// run runs kubectl against the cluster and returns its standard output.
func (s *suite) run(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := s.runErr(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (s *suite) runErr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, s.kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+os.Getenv(envKubeconfig))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// timeout bounds one test step generously: the suite checks behaviour, the
// step's figures are what it reports.
func stepContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
