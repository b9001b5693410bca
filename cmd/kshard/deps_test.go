package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestReplicaBinaryLinksNoTestHarness: the replica binary must not link
// controller-runtime's envtest (the sandbox's control plane, in
// cmd/kshard-dev). Its package init writes to the file system and panics
// when it cannot, which made every replica of the shipped image, whose root
// file system is read-only, crash at start. Nor may it link an API server
// (k8s.io/apiserver's generic server, the custom metrics API server of
// cmd/kshard-metrics-adapter): that is another binary's size, package
// inits and global flags and metrics, which a controller replica has no use
// for. Nor the stand-in config center's server (internal/configcenter/standin):
// a replica is its client, and the server's store, fault injection and
// metrics registry are the sandbox's and the tests'.
func TestReplicaBinaryLinksNoTestHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "controller-runtime/pkg/envtest") || strings.HasSuffix(pkg, "kshard/internal/controlplane") {
			t.Errorf("kshard links %s: the sandbox's test harness belongs in cmd/kshard-dev", pkg)
		}
		// (The authentication and authorization pieces of k8s.io/apiserver
		// that controller-runtime's secure metrics filter uses are fine.)
		if pkg == "k8s.io/apiserver/pkg/server" || pkg == "k8s.io/apiserver/pkg/endpoints" ||
			strings.HasPrefix(pkg, "sigs.k8s.io/custom-metrics-apiserver/") || strings.HasSuffix(pkg, "kshard/cmd/kshard-metrics-adapter/internal/custommetrics") {
			t.Errorf("kshard links %s: the custom metrics API server belongs in cmd/kshard-metrics-adapter", pkg)
		}
		if strings.HasSuffix(pkg, "kshard/internal/configcenter/standin") {
			t.Errorf("kshard links %s: the stand-in config center's server belongs in cmd/configcenter", pkg)
		}
	}
}

// TestLibraryModuleGetsNoToolDependencies: a team that imports sharding,
// externalcache or shardcache requires this module, and with it every module
// this go.mod requires. The load tester's (goja, esbuild), deploy/'s and
// the end-to-end suite's (kind, kustomize) and the metrics adapter's
// (custom-metrics-apiserver) live in modules of their own (go.work), so
// that none of them reaches a library user's module graph.
func TestLibraryModuleGetsNoToolDependencies(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "all")
	cmd.Dir = "../.."
	cmd.Env = append(cmd.Environ(), "GOWORK=off") // the main module as a user requires it
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		mod := strings.Fields(line)[0]
		for _, tool := range []string{"github.com/dop251/goja", "github.com/evanw/esbuild", "sigs.k8s.io/kind",
			"sigs.k8s.io/kustomize/", "sigs.k8s.io/custom-metrics-apiserver", "github.com/kshard/kshard/"} {
			if strings.HasPrefix(mod, tool) {
				t.Errorf("the main module requires %s: a library user would get it", mod)
			}
		}
	}
}
