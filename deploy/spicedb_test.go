package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kshard/kshard/authzcache"
	"github.com/kshard/kshard/authzcache/spicedbsource"
	"github.com/kshard/kshard/internal/spicedbserver"
)

// TestNodeSpiceDB: deploy/node runs SpiceDB (deploy/spicedb) from the
// image `make cluster` imports, and its replicas ask it, by the Service's
// environment variables (the node has no DNS), with the key of its Secret.
// The schema deploy/spicedb loads is the one kshard ships, and the files
// the Deployment loads, run through a real SpiceDB as it runs them, let
// the namespaces of the smoke test, the end-to-end suite and the load
// tester read the node's domains, and no other namespace.
func TestNodeSpiceDB(t *testing.T) {
	objs := build(t, "node")
	var sts appsv1.StatefulSet
	var dep appsv1.Deployment
	fromUnstructured(t, byName(t, objs, "StatefulSet", "kshard"), &sts)
	fromUnstructured(t, byName(t, objs, "Deployment", "spicedb"), &dep)
	c := dep.Spec.Template.Spec.Containers[0]
	if c.Image != "spicedb:dev" || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("SpiceDB runs %s (pull %s), want spicedb:dev, never pulled: the image make cluster imports", c.Image, c.ImagePullPolicy)
	}
	k := sts.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--authorization=spicedb", "--spicedb-endpoint=$(SPICEDB_ENDPOINT)", "--spicedb-token-file=/spicedb/token"} {
		if !slices.Contains(k.Args, want) {
			t.Errorf("the replicas' arguments lack %s: %v", want, k.Args)
		}
	}
	endpoint := ""
	for _, e := range k.Env {
		if e.Name == "SPICEDB_ENDPOINT" {
			endpoint = e.Value
		}
	}
	if endpoint != "$(SPICEDB_SERVICE_HOST):$(SPICEDB_SERVICE_PORT_GRPC)" {
		t.Errorf("SPICEDB_ENDPOINT %q: the node has no DNS, the Service's environment variables name SpiceDB", endpoint)
	}

	// The ConfigMaps' files, where the Deployment mounts them.
	dir := t.TempDir()
	mounts := map[string]string{} // volume → mount path
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	files := map[string]string{} // path in the pod → path here
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		var cm corev1.ConfigMap
		fromUnstructured(t, byName(t, objs, "ConfigMap", v.ConfigMap.Name), &cm)
		for name, data := range cm.Data {
			local := filepath.Join(dir, v.Name+"-"+name)
			if err := os.WriteFile(local, []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
			files[mounts[v.Name]+"/"+name] = local
		}
	}
	var bootstrap []string
	for _, a := range c.Args {
		if p, ok := strings.CutPrefix(a, "--datastore-bootstrap-files="); ok {
			if files[p] == "" {
				t.Fatalf("SpiceDB loads %s, which no ConfigMap mounts", p)
			}
			bootstrap = append(bootstrap, files[p])
		}
	}
	if len(bootstrap) != 2 {
		t.Fatalf("SpiceDB loads %d bootstrap files, want the schema and the node's grants", len(bootstrap))
	}
	var schema struct {
		Schema string `json:"schema"`
	}
	b, err := os.ReadFile(bootstrap[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(schema.Schema) != strings.TrimSpace(spicedbsource.Schema) {
		t.Errorf("deploy/spicedb/schema.yaml's schema differs from spicedbsource.Schema:\n%s\nwant\n%s", schema.Schema, spicedbsource.Schema)
	}

	if testing.Short() {
		t.Skip("runs a SpiceDB process")
	}
	ctx := context.Background()
	srv, err := spicedbserver.Start(ctx, spicedbserver.Options{Dir: t.TempDir(), BootstrapFiles: bootstrap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	client, err := spicedbsource.NewClient(srv.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	src, err := spicedbsource.New(client)
	if err != nil {
		t.Fatal(err)
	}
	qs := []authzcache.Question{
		{Namespace: "shop", Domain: "domain-7"}, {Namespace: "e2e-3", Domain: "domain-49"},
		{Namespace: "loadtest", Domain: "domain-99"}, {Namespace: "loadtest", Domain: "domain-100"},
		{Namespace: "e2e-intruder", Domain: "domain-0"},
	}
	want := []bool{true, true, true, false, false}
	ds, err := src.Check(ctx, qs, "")
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		if d.Allowed != want[i] {
			t.Errorf("%s: allowed %v, want %v (%s)", qs[i], d.Allowed, want[i], d.Missing)
		}
	}
}
