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
// file system is read-only, crash at start.
func TestReplicaBinaryLinksNoTestHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "controller-runtime/pkg/envtest") || strings.HasSuffix(pkg, "kshard/internal/controlplane") {
			t.Errorf("kshard links %s: the sandbox's test harness belongs in cmd/kshard-dev", pkg)
		}
	}
}
