package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configetcd"
)

// configEtcdIP is the cluster IP deploy/node gives the etcd's Service, the
// address its server certificate names (the node has no DNS).
const configEtcdIP = "10.96.0.20"

// installEtcdCerts makes the etcd's Secrets as a user of the node does,
// with hack/etcdcert: the server certificate and the client certificate
// the replicas present (the etcd demands one).
func (s *suite) installEtcdCerts(ctx context.Context, t *testing.T) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", "run", "./hack/etcdcert", "-namespace", systemNamespace, "-ip", configEtcdIP)
	cmd.Dir = s.repo
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/etcdcert: %v\n%s", err, stderr.String())
	}
	path := filepath.Join(t.TempDir(), "etcd-certs.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	s.ensureNamespace(ctx, t, systemNamespace)
	s.run(ctx, t, "apply", "--server-side", "-f", path)
}

// seedConfigEtcd waits for the etcd of deploy/config-etcd and writes the
// domains and keys the suite's objects bind, through its Service over TLS
// with the replicas' client certificate: what they read is what the suite
// wrote, by way of a real etcd.
func (s *suite) seedConfigEtcd(ctx context.Context, t *testing.T) {
	t.Helper()
	s.run(ctx, t, "-n", systemNamespace, "rollout", "status", "statefulset/"+configetcd.ClusterService, "--timeout=5m")
	cl, err := configetcd.ConnectCluster(ctx, s.cs, systemNamespace, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Client.Close()
	rev, err := configetcd.Seed(ctx, cl.Client, etcdsource.DefaultPrefix,
		configcenter.SeedOptions{Domains: seededDomains, KeysPerDomain: seededKeys, ValueBytes: 64})
	if err != nil {
		t.Fatalf("seeding the etcd at %s: %v", cl.Endpoint, err)
	}
	t.Logf("seeded %d domains × %d keys into the etcd at %s (revision %d)", seededDomains, seededKeys, cl.Endpoint, rev)
}
