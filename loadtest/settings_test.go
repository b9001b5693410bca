package loadtest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/settings.txt from the current code")

// TestSettingsText writes the settings table of runs of several kinds
// (chaos on processes and on pods, capacity, storms without load, the
// config center's outage) and compares it with testdata/settings.txt, made
// by the code before the settings were split out of newReport.
func TestSettingsText(t *testing.T) {
	var got strings.Builder
	for _, tc := range []struct {
		scenario string
		pods     bool
		set      func(*Options)
	}{
		{scenario: "chaos"},
		{scenario: "chaos", pods: true, set: func(o *Options) { o.StatefulSet, o.NodeFaults, o.MemoryLimit = "kshard/kshard", "ssh node", "256Mi" }},
		{scenario: "capacity", set: func(o *Options) { o.ReplicaCPU = "500m" }},
		{scenario: "resync-storm", set: func(o *Options) { o.MemoryLimit = "0" }},
		{scenario: "external-outage"},
	} {
		o := Options{Scenario: tc.scenario, Out: t.TempDir(), Command: "loadtest"}
		if tc.set != nil {
			tc.set(&o)
		}
		sc := scenarios[tc.scenario]
		if err := o.setDefaults(sc); err != nil {
			t.Fatalf("%s: %v", tc.scenario, err)
		}
		r := &run{sc: sc, bench: &bench{opts: o, apiAuditLog: "audit.log", fencing: &fencing{enforced: true}, center: &etcdCenter{desc: "(the etcd center's description)"}}}
		r.faults = &faults{r: r}
		r.faults.rotation, _ = parseFaults(o.Faults, tc.pods, o.NodeFaults != "")
		if tc.pods {
			r.pods = &podTarget{namespace: "kshard", name: "kshard", image: "kshard:dev", ring: "kshard"}
			r.center = &httpCenter{desc: "(the cluster's stand-in's description)"}
		}
		fmt.Fprintf(&got, "## %s pods=%v\n", tc.scenario, tc.pods)
		for _, s := range (reporter{r}).newReport(context.Background()).Settings {
			fmt.Fprintf(&got, "%s: %s\n", s[0], s[1])
		}
	}
	golden := filepath.Join("testdata", "settings.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("settings\n%s\nwant\n%s", got.String(), want)
	}
}
