package deploy_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/controlplane"
)

// TestNodeConfigEtcd: deploy/node runs its own etcd as the config center,
// from the image `make cluster` imports, at the fixed cluster IP of
// hack/cluster/env.sh, and points the replicas at it with the client
// certificate's Secret. The certificates hack/etcdcert makes for that IP
// work with a real etcd: it serves TLS for the IP and the Service's name,
// and a client with the replicas' Secret reads and writes.
func TestNodeConfigEtcd(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	env, err := os.ReadFile(filepath.Join(root, "hack", "cluster", "env.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CONFIG_ETCD_IP=(\S+)$`).FindSubmatch(env)
	if m == nil {
		t.Fatal("hack/cluster/env.sh sets no CONFIG_ETCD_IP")
	}
	ip := string(m[1])

	objs := build(t, "node")
	var sts, etcd appsv1.StatefulSet
	fromUnstructured(t, byName(t, objs, "StatefulSet", "kshard"), &sts)
	fromUnstructured(t, byName(t, objs, "StatefulSet", configetcd.ClusterService), &etcd)
	var svc corev1.Service
	fromUnstructured(t, byName(t, objs, "Service", configetcd.ClusterService), &svc)
	if svc.Spec.ClusterIP != ip {
		t.Errorf("Service %s's cluster IP %q, want hack/cluster/env.sh's CONFIG_ETCD_IP %s (the certificate names it)", svc.Name, svc.Spec.ClusterIP, ip)
	}
	if c := etcd.Spec.Template.Spec.Containers[0]; c.Image != "etcd:dev" || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("the etcd runs %s (pull %s), want etcd:dev, never pulled: the image make cluster imports", c.Image, c.ImagePullPolicy)
	}
	// The node has no DNS: the Service's environment variables, by the
	// port's name.
	checkEtcdClient(t, sts, etcd, "https://$(CONFIG_ETCD_SERVICE_HOST):$(CONFIG_ETCD_SERVICE_PORT_CLIENT)")

	secrets := etcdCerts(t, root, "-namespace", svc.Namespace, "-ip", ip)
	server, client := secrets["config-etcd-tls"], secrets[configetcd.ClientSecret]
	if server == nil || client == nil {
		t.Fatalf("hack/etcdcert wrote Secrets %v, want config-etcd-tls and %s", slices.Sorted(maps.Keys(secrets)), configetcd.ClientSecret)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(server.Data["ca.crt"]) {
		t.Fatal("config-etcd-tls has no CA certificate")
	}
	block, _ := pem.Decode(server.Data["tls.crt"])
	if block == nil {
		t.Fatal("config-etcd-tls has no certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ip, svc.Name + "." + svc.Namespace + ".svc", "127.0.0.1"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
			t.Errorf("the server certificate is not valid for %s: %v", name, err)
		}
	}

	dir := t.TempDir()
	file := func(s *corev1.Secret, key string) string {
		p := filepath.Join(dir, s.Name+"-"+key)
		if err := os.WriteFile(p, s.Data[key], 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	srv, err := configetcd.Start(context.Background(), configetcd.Options{Dir: filepath.Join(dir, "etcd"), TLS: &configetcd.TLS{
		CAFile: file(server, "ca.crt"), CertFile: file(server, "tls.crt"), KeyFile: file(server, "tls.key"),
		ClientCertFile: file(client, "tls.crt"), ClientKeyFile: file(client, "tls.key")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := etcdsource.NewClient(etcdsource.ClientOptions{Servers: []string{srv.Endpoint()},
		CAFile: file(client, "ca.crt"), CertFile: file(client, "tls.crt"), KeyFile: file(client, "tls.key")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := etcdsource.DefaultPrefix + "/domain-7/key-0"
	if _, err := c.Put(ctx, key, "smoke"); err != nil {
		t.Fatalf("a client with the replicas' Secret cannot write: %v", err)
	}
	resp, err := c.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "smoke" {
		t.Fatalf("a client with the replicas' Secret read %v, %v; want smoke", resp, err)
	}
}

// etcdCerts runs hack/etcdcert with args and returns its Secrets by name.
func etcdCerts(t *testing.T, root string, args ...string) map[string]*corev1.Secret {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", "./hack/etcdcert"}, args...)...)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/etcdcert: %v\n%s", err, stderr.String())
	}
	secrets := map[string]*corev1.Secret{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var s corev1.Secret
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("hack/etcdcert wrote %q: %v", doc, err)
		}
		secrets[s.Name] = &s
	}
	return secrets
}
