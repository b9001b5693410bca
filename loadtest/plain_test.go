package loadtest

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func testReplicaConfig() replicaConfig {
	return replicaConfig{
		kubeconfig: "/w/kubeconfig", id: "kshard-0", centerURL: "http://127.0.0.1:1234",
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
	want := []string{"kubeconfig", "replica-id", "lease-namespace", "configcenter-url", "metrics-bind-address",
		"health-probe-bind-address", "lease-duration", "renew-deadline", "retry-period", "zap-log-level"}
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
	if last := shardingFleets[len(shardingFleets)-1]; !hasPlain(shardingFleets) || !last.Mode.Plain {
		t.Errorf("compare-sharding's last column is %s, want the plain controller (it runs last)", last.Mode.Name)
	}
	if !scenarios["compare-sharding"].plain || scenarios["basic"].plain {
		t.Error("only compare-sharding builds the plain controller")
	}
}

// TestRenderPlainFleet: the plain fleet's column says what it lacks rather
// than a zero, the singleton ratio keeps kshard's singleton as its base, and
// the start rows compare every fleet's start with the plain one's.
func TestRenderPlainFleet(t *testing.T) {
	rep := &Report{
		Scenario: "compare-sharding",
		Fleets: []*FleetResult{
			{Fleet: "plain controller-runtime ×1", Mode: ModePlain.Name, Plain: true, APICounted: true, Scanned: 10000, Syncs: 1, HeldMax: -1,
				CacheHitRatio: -1, ReconcileP99: -1, ControllerWritesPerUpdate: 2, WritesCounted: true,
				StartObjects: 4000, StartSettled: 40 * time.Second, StartWritesCounted: true, StartWrites: 8000,
				PerReplica: []ReplicaResult{{Replica: "kshard-0", Processes: 1, Samples: 60, HeapPeak: 10 << 20, HeapEnd: 8 << 20, RSSPeak: 30 << 20, Reconciles: 4000, CacheHitRatio: -1}}},
			{Fleet: "sharding off ×1", Mode: ModeSingleton.Name, Args: ModeSingleton.Args, APICounted: true, Scanned: 5000, Syncs: 1, HeldMax: -1,
				CacheHitRatio: 0.9, ReconcileP99: -1, ControllerWritesPerUpdate: -1,
				StartObjects: 4000, StartSettled: 10 * time.Second, StartWritesCounted: true, StartWrites: 0},
			{Fleet: "sharded ×2", Mode: ModeSharded.Name, Args: ModeSharded.Args, APICounted: true, Samples: 120, Scanned: 640000, Syncs: 128, HeldMax: 2000,
				CacheHitRatio: 0.9, ReconcileP99: -1, ControllerWritesPerUpdate: -1,
				StartObjects: 4000, StartSettled: 20 * time.Second, StartError: "did not settle"},
		},
	}
	md := renderMarkdown(rep)
	for _, want := range []string{
		"| controller flags | `plaincontroller` (no kshard code) | `--sharding=off --external-mode=cache` |",
		"| ConfigBindings scanned for initial syncs ÷ singleton's | 2.00× | 1.00× | 128.00× |",
		"| ConfigBindings held per replica, peak (largest) | all (one cache of every object) | all (one cache of every object) | 2000 |",
		"| external-cache hit ratio (fresh or stale) | n/a (no cache) | 90.0 % | 90.0 % |",
		"| objects existing at the fleet's start | 4000 | 4000 | 4000 |",
		"| fleet start → every object reconciled (and Ready at its latest generation) | 40.00 s | 10.00 s | not settled |",
		"| … ÷ plain controller-runtime ×1's | 1.00× | 0.25× | n/a |",
		"| … ConfigBinding and ConfigMap writes during it | 8000 | 0 | n/a |",
		"| plain controller-runtime ×1 | kshard-0 | 1 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(md, "| plain controller-runtime ×1 | kshard-0 | 1 | 10.0 MiB | 8.0 MiB | 30.0 MiB | - | all | 4000 | n/a |") == false {
		t.Error("the plain replica's row must say - and all for shard metrics, n/a for the cache")
	}

	// Without objects at any fleet's start (basic), no start rows.
	for _, f := range rep.Fleets {
		f.StartObjects = 0
	}
	if md := renderMarkdown(rep); strings.Contains(md, "fleet start → every object reconciled") {
		t.Error("start rows without objects at the start")
	}
}
