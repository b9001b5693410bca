package loadtest

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func testReplicaConfig() replicaConfig {
	return replicaConfig{
		kubeconfig: "/w/kubeconfig", id: "kshard-0", center: []string{"--config-center", "etcd", "--etcd-servers", "http://127.0.0.1:1234"},
		metricsAddr: "127.0.0.1:2000", healthAddr: "127.0.0.1:2001", audit: "/w/audit/x.jsonl",
		leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 5 * time.Second,
	}
}

// flagNames lists the flag names of a command line, "--x=y" and "--x y"
// alike.
func flagNames(args []string) []string {
	var out []string
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			name, _, _ = strings.Cut(name, "=")
			out = append(out, name)
		}
	}
	return out
}

// TestPlainReplicaArgs: the plain controller gets only the flags it has
// (cmd/plaincontroller's TestLoadTesterCommandLine parses the same list),
// never a kshard-only one, which it would refuse; kshard gets its own.
func TestPlainReplicaArgs(t *testing.T) {
	c := testReplicaConfig()
	c.audit = ""
	plain := replicaArgs(ModePlain, c)
	want := []string{"kubeconfig", "replica-id", "lease-namespace", "metrics-bind-address",
		"health-probe-bind-address", "lease-duration", "renew-deadline", "retry-period", "zap-log-level", "config-center", "etcd-servers"}
	if got := flagNames(plain); !slices.Equal(got, want) {
		t.Errorf("plain flags %v, want %v", got, want)
	}
	if plain[0] == "controller" {
		t.Error("the plain controller has no subcommand")
	}
	for _, kshardOnly := range []string{"ring", "statefulset", "audit-log", "sharding", "external-mode", "external-source", "shards"} {
		if slices.Contains(flagNames(plain), kshardOnly) {
			t.Errorf("the plain command line has kshard's --%s", kshardOnly)
		}
	}
	if i := slices.Index(plain, "--replica-id"); i < 0 || plain[i+1] != "kshard-0" {
		t.Errorf("plain command line %v lacks the replica id", plain)
	}

	sharded := replicaArgs(ModeSharded, testReplicaConfig())
	if sharded[0] != "controller" {
		t.Errorf("kshard's command line starts with %q, want the controller subcommand", sharded[0])
	}
	names := flagNames(sharded)
	for _, f := range []string{"ring", "statefulset", "audit-log", "sharding", "external-mode"} {
		if !slices.Contains(names, f) {
			t.Errorf("kshard's command line lacks --%s: %v", f, sharded)
		}
	}
	// The mode's flags come last, so they win over the load tester's.
	if got := sharded[len(sharded)-2:]; !slices.Equal(got, ModeSharded.Args) {
		t.Errorf("kshard's command line ends with %v, want the mode's %v", got, ModeSharded.Args)
	}
	if !slices.Contains(sharded, "/w/audit/x.jsonl") {
		t.Errorf("kshard's command line lacks the audit log: %v", sharded)
	}
}

func TestPlainModeIsNotSharded(t *testing.T) {
	if ModePlain.Sharded() {
		t.Error("the plain mode has no ring")
	}
	specs, err := scenarios["compare-sharding"].fleets(3)
	if err != nil {
		t.Fatal(err)
	}
	if last := specs[len(specs)-1]; !last.Mode.Plain {
		t.Errorf("compare-sharding's last column is %s, want the plain controller (it runs last)", last.Mode.Name)
	}
	if !specs[1].ColdTable || specs[2].ColdTable {
		t.Errorf("compare-sharding's first sharded fleet starts on a cold shard table, the next on a filled one: %+v", specs)
	}
	if !scenarios["compare-sharding"].plain() || scenarios["basic"].plain() {
		t.Error("only compare-sharding builds the plain controller")
	}
}
