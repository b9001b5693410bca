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
			strings.HasPrefix(pkg, "sigs.k8s.io/custom-metrics-apiserver/") || strings.HasSuffix(pkg, "kshard/internal/custommetrics") {
			t.Errorf("kshard links %s: the custom metrics API server belongs in cmd/kshard-metrics-adapter", pkg)
		}
		if strings.HasSuffix(pkg, "kshard/internal/configcenter/standin") {
			t.Errorf("kshard links %s: the stand-in config center's server belongs in cmd/configcenter", pkg)
		}
	}
}
