// Command loadtest runs kshard's load-test scenarios on one machine and
// writes their reports: a control plane (or an existing cluster), the
// config center and fleets of `kshard controller` processes under a load of
// ConfigBinding creates and updates, with side-by-side baselines and chaos,
// measured through a Prometheus, and Markdown reports. It is package
// loadtest plus flags.
//
//	go run ./loadtest/cmd/loadtest --scenario basic --duration 30s
//	go run ./loadtest/cmd/loadtest --list-scenarios
//
// It exits 0 when the run completed (and, for chaos and rolling-restart,
// every check passed), 1 otherwise, and 130 when interrupted; Ctrl-C stops
// every child process and the control plane on the way out.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kshard/kshard/loadtest"
)

func main() {
	os.Exit(run())
}

// flags are the command line, beside the options it sets.
type flags struct {
	list bool
	seed uint64
	// calibrateFor defaults to the real default, so that 0 can mean off.
	calibrateFor time.Duration
	// memoryLimit is empty for the scenario's default; "0" means none.
	memoryLimit string
	zap         zap.Options
}

// scenarioDefault is the end of the help of an option some scenarios set.
const scenarioDefault = "; some scenarios set their own: --list-scenarios"

// bindFlags defines the flags on fs. Each help is one line;
// loadtest/README.md explains the options.
func bindFlags(fs *flag.FlagSet, o *loadtest.Options, fl *flags) {
	fs.StringVar(&o.Scenario, "scenario", "", "scenario to run (--list-scenarios shows them)")
	fs.BoolVar(&fl.list, "list-scenarios", false, "list the scenarios, with the defaults each sets, and exit")
	fs.DurationVar(&o.Duration, "duration", 0, "load per measured phase, per fleet in a comparison (default 60s"+scenarioDefault+")")
	fs.IntVar(&o.Objects, "objects", 0, "ConfigBindings (default 1000"+scenarioDefault+")")
	fs.IntVar(&o.Domains, "domains", 0, "business domains, seeded in the config center (default 100"+scenarioDefault+")")
	fs.IntVar(&o.KeysPerDomain, "keys-per-domain", 0, "keys seeded per domain (default 16)")
	fs.IntVar(&o.KeysPerObject, "keys-per-object", 0, "keys each ConfigBinding binds (default 2)")
	fs.IntVar(&o.Replicas, "replicas", 0, "controller replicas (default 3)")
	fs.Float64Var(&o.CreateRate, "create-rate", 0, "ConfigBinding creations per second (default 200"+scenarioDefault+")")
	fs.Float64Var(&o.UpdateRate, "update-rate", 0, "spec updates per object per second (default 0.02"+scenarioDefault+")")
	fs.StringVar(&o.Skew, "skew", "", "spread of objects over domains: uniform or zipf (default uniform)")
	fs.Float64Var(&o.ZipfS, "zipf-s", 0, "Zipf exponent, above 1 (default 1.1)")
	fs.Uint64Var(&fl.seed, "seed", 0, "seed of object placement and update order (default 1)")
	fs.IntVar(&o.ValueBytes, "value-bytes", 0, "bytes per config-center value (default 256)")
	fs.DurationVar(&o.ValueChangeInterval, "value-change-interval", 0, "change one bound config-center value per interval under load and time its arrival (default off"+scenarioDefault+")")
	fs.StringVar(&o.ConfigCenter, "config-center", "", "the config center: etcd (an etcd of the run's own; default) or http (kshard's stand-in); on --statefulset the cluster's stand-in")
	fs.DurationVar(&o.Latency, "latency", 0, "config-center latency per data request (default 5ms"+scenarioDefault+")")
	fs.DurationVar(&o.Jitter, "jitter", 0, "uniform random latency on top of --latency (--config-center http)")
	fs.Float64Var(&o.ErrorRate, "error-rate", 0, "share of config-center data requests answered 500 (--config-center http)")
	fs.DurationVar(&o.OutageAfter, "outage-after", 0, "config-center outage start, into each measured phase (external-outage: duration/3)")
	fs.DurationVar(&o.OutageFor, "outage-for", 0, "config-center outage length; 0 means none (external-outage: duration/3)")
	fs.DurationVar(&o.LeaseDuration, "lease-duration", 0, "replicas' lease duration, whole seconds (default 15s)")
	fs.Func("shards", "the ring's shard count, fenced shard by shard (default 64; on --statefulset the pods' is read)", func(v string) error {
		n, err := strconv.ParseInt(v, 10, 32)
		o.Shards = int32(n)
		return err
	})
	fs.DurationVar(&o.RenewDeadline, "renew-deadline", 0, "replicas' renew deadline (default 10s)")
	fs.DurationVar(&o.RetryPeriod, "retry-period", 0, "replicas' Lease renewal period (default 5s)")
	fs.DurationVar(&o.ChaosInterval, "chaos-interval", 0, "chaos: time between faults, from the settle after the last one (default 30s)")
	fs.DurationVar(&o.RestartDelay, "restart-delay", 0, "chaos: how long a killed replica stays down (default 5s)")
	fs.DurationVar(&o.PauseFor, "pause-for", 0, "chaos: how long a paused replica stays stopped, in (lease duration, chaos interval) (default lease duration + 2 × retry period)")
	fs.DurationVar(&o.DelayFor, "delay-for", 0, "chaos: how long a delay or partition fault lasts, in (lease duration, chaos interval) (default lease duration + 2 × retry period)")
	fs.StringVar(&o.Faults, "faults", "", "chaos: the fault kinds in rotation, comma-separated (default all of the target's; loadtest/README.md lists them)")
	fs.BoolVar(&o.NoFencing, "no-fencing", false, "leave the kshard-shard-writes admission policy unbound, so late writes commit (the write check then fails)")
	fs.DurationVar(&o.ClockOffset, "clock-offset", 0, "chaos: the Lease clock offset of a clock fault, ahead and behind in turn; above the lease duration (default 30s)")
	fs.StringVar(&fl.memoryLimit, "memory-limit", "", "every replica's --memory-limit, the report's memory yardstick; 0 for none (default "+loadtest.DefaultMemoryLimit+scenarioDefault+")")
	fs.StringVar(&o.ReplicaCPU, "replica-cpu", "", "CPU quota of every replica process (e.g. 50m), a cgroup of its own; needs root on cgroup v1 (default none"+scenarioDefault+")")
	fs.DurationVar(&o.SettleTimeout, "settle-timeout", 0, "bound of every wait for the fleet to settle (default 5m"+scenarioDefault+")")
	fs.DurationVar(&fl.calibrateFor, "calibrate-for", 5*time.Second, "how long to measure the API server's write ceiling before the first fleet; 0 turns it off")
	fs.DurationVar(&o.StopTimeout, "stop-timeout", 0, "grace period of a replica after SIGTERM before SIGKILL (default 45s)")
	fs.StringVar(&o.Fleets, "fleets", "", "compare-*: the fleets to compare, as mode:replicas,… of sharded, off, plain, cache, mirror, direct (e.g. off:1,sharded:4)")
	fs.Func("replica-args", "flags appended to every kshard replica's command line, space-separated (e.g. \"--max-concurrent-reconciles=16\")", func(v string) error {
		o.ReplicaArgs = append(o.ReplicaArgs, strings.Fields(v)...)
		return nil
	})
	fs.BoolVar(&o.Profile, "profile", false, "write CPU and heap profiles of every replica, and the API server's heap, per measured phase into the work folder's profiles/")
	fs.StringVar(&o.Out, "out", "", "report folder (default loadtest/results)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "target this cluster instead of starting a control plane (it must hold no namespace \"loadtest\")")
	fs.StringVar(&o.NodeFaults, "node-faults", "", "with --statefulset: the command that injects faults of the pods' node (make cluster's hack/cluster/fault.sh)")
	fs.StringVar(&o.APIServerAuditLog, "apiserver-audit-log", "", "with --kubeconfig: the cluster's kube-apiserver audit log (JSON), which the write check reads")
	fs.StringVar(&o.StatefulSet, "statefulset", "", "namespace/name: run basic or chaos on this StatefulSet's kshard pods in the --kubeconfig cluster")
	fs.StringVar(&o.AssetsDir, "assets-dir", "", "etcd and kube-apiserver of the control plane (default $KUBEBUILDER_ASSETS, else bin/k8s)")
	fs.StringVar(&o.Prometheus, "prometheus", "", "the Prometheus server every figure is queried from (default $PROMETHEUS, else bin/prometheus)")
	fs.StringVar(&o.BinDir, "bin-dir", "", "folder with the kshard, configcenter and plaincontroller binaries (default: go build them)")
	fs.StringVar(&o.WorkDir, "work-dir", "", "folder for logs and audit logs, kept (default: a temporary folder, removed after a passing run)")
	fs.DurationVar(&o.SampleInterval, "sample-interval", 0, "how often replicas and the config center are sampled (default 1s"+scenarioDefault+")")
	fl.zap.BindFlags(fs)
}

func run() int {
	var (
		o  loadtest.Options
		fl flags
	)
	fs := flag.NewFlagSet("loadtest", flag.ExitOnError)
	bindFlags(fs, &o, &fl)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: loadtest --scenario NAME [flags]\n\nRuns a kshard load-test scenario and writes its report; loadtest/README.md explains each number.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:]) // ExitOnError
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(os.Stderr, "loadtest: unexpected arguments %q\n", fs.Args())
		return 2
	case fl.list:
		listScenarios()
		return 0
	case o.Scenario == "":
		fmt.Fprintln(os.Stderr, "loadtest: --scenario is required (--list-scenarios shows them)")
		return 2
	}
	o.Seed, o.MemoryLimit, o.CalibrateFor = fl.seed, fl.memoryLimit, fl.calibrateFor
	if fl.calibrateFor == 0 {
		o.CalibrateFor = -1 // Options' zero means the default
	}
	o.Command = command(os.Args[1:])
	log := zap.New(zap.UseFlagOptions(&fl.zap))
	ctrl.SetLogger(log)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep, err := loadtest.Run(ctrl.LoggerInto(ctx, log), o)
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(os.Stderr, "loadtest: interrupted after %s; every child process was stopped\n", time.Since(start).Round(time.Second))
		return 130
	case err != nil:
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		return 1
	}
	return printChecks(rep)
}

// listScenarios prints every scenario, what it does and the defaults it
// sets.
func listScenarios() {
	for _, s := range loadtest.Scenarios() {
		fmt.Printf("%s\n    %s\n", s.Name, s.Doc)
		if len(s.Defaults) > 0 {
			fmt.Printf("    Defaults: %s\n", strings.Join(s.Defaults, ", "))
		}
		fmt.Println()
	}
}

// printChecks prints the report's checks and returns the exit code: 1 when
// a check of a gated scenario failed.
func printChecks(rep *loadtest.Report) int {
	var failed []loadtest.Check
	for _, c := range rep.Checks {
		mark := "pass"
		switch {
		case !c.Passed:
			mark, failed = "FAIL", append(failed, c)
		case c.NotApplicable:
			mark = "n/a"
		}
		fmt.Printf("%-4s  %s: %s\n", mark, c.Name, c.Detail)
	}
	// The last lines name what failed, so a log's tail says why.
	for _, c := range failed {
		fmt.Fprintf(os.Stderr, "loadtest: FAILED %s: %s\n", c.Name, c.Detail)
	}
	switch {
	case len(failed) > 0 && rep.Gated:
		fmt.Fprintf(os.Stderr, "loadtest: %d checks failed\n", len(failed))
		return 1
	case len(failed) > 0:
		fmt.Fprintf(os.Stderr, "loadtest: %d checks failed (reported; %s does not gate on them)\n", len(failed), rep.Scenario)
	}
	return 0
}

// command is how the report says to reproduce the run: from the
// repository root, with the flags as given.
func command(args []string) string {
	quoted := make([]string, 0, len(args))
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\*?[]{}()<>|&;#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		quoted = append(quoted, a)
	}
	return strings.TrimSpace("go run ./loadtest/cmd/loadtest " + strings.Join(quoted, " "))
}
