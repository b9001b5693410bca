package loadtest

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// Domain skews.
const (
	// SkewUniform spreads objects evenly over the domains.
	SkewUniform = "uniform"
	// SkewZipf gives domain i a share proportional to 1/(i+1)^s: a few large
	// tenants and a long tail, as business domains usually are.
	SkewZipf = "zipf"
)

// Options configure a run. A zero field takes the scenario's default, else
// the global default documented on it, so a caller sets only what it means
// to change.
type Options struct {
	// Scenario names what to run (see Scenarios). Required.
	Scenario string
	// Duration is how long load runs in each measured phase (per fleet in a
	// comparison). Default 60s.
	Duration time.Duration

	// Objects is the number of ConfigBindings. Default 1,000.
	Objects int
	// Domains is the number of business domains, seeded in the config
	// center as domain-0..N-1. Default 100.
	Domains int
	// KeysPerDomain is the number of keys seeded per domain. Default 16.
	KeysPerDomain int
	// KeysPerObject is the number of keys each ConfigBinding binds. Default 2.
	KeysPerObject int
	// Replicas is the number of controller replicas. Default 3.
	Replicas int
	// CreateRate is ConfigBinding creations per second. Default 200.
	CreateRate float64
	// UpdateRate is spec updates per object per second; the run issues
	// Objects × UpdateRate updates per second. Default 0.02 (20/s at 1,000
	// objects).
	UpdateRate float64
	// Skew spreads objects over domains: SkewUniform (default) or SkewZipf.
	Skew string
	// ZipfS is the Zipf exponent, above 1. Default 1.1.
	ZipfS float64
	// Seed makes object placement and update order reproducible. Default 1.
	Seed uint64

	// ConfigCenter is the run's config center: CenterEtcd (default), an
	// etcd of the run's own, or CenterHTTP, kshard's stand-in. On a
	// StatefulSet's pods it is the cluster's: deploy/config-etcd's etcd,
	// or deploy/configcenter's stand-in.
	ConfigCenter string
	// ValueBytes is the size of every config-center value. Default 256.
	ValueBytes int
	// Latency is added to every data request: by a proxy in front of etcd
	// (on the request's way), by the stand-in itself; a cluster's etcd
	// gets none. Jitter, the stand-in only, adds up to as much again,
	// uniformly. Default 5ms and 0.
	Latency, Jitter time.Duration
	// ValueChangeInterval, when set, writes a new value to one bound key of
	// the config center per interval during each fleet's measured phase and
	// measures how fast it reaches the ConfigMaps. Default off
	// (compare-external: 2s).
	ValueChangeInterval time.Duration
	// ErrorRate is the share of data requests the config center fails with
	// 500, the stand-in only. Default 0.
	ErrorRate float64
	// OutageAfter and OutageFor schedule a config-center outage (etcd
	// stopped; the stand-in answering 503 on every data request) within
	// the measured phase of every fleet: from OutageAfter into it, for
	// OutageFor. The external-outage scenario sets
	// them; zero OutageFor means no outage.
	OutageAfter, OutageFor time.Duration

	// LeaseDuration, RenewDeadline and RetryPeriod are passed to every
	// replica. Default: the sharding package's defaults (15s, 10s, 5s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Shards is the ring's shard count: passed to every replica (--shards),
	// bound as that many fencing bindings, and what the ring and label
	// checks judge by. On a StatefulSet the pods' --shards is read instead.
	// Default: the sharding package's (64).
	Shards int32
	// ChaosInterval is the time between crashes in the chaos scenario.
	// Default 30s.
	ChaosInterval time.Duration
	// RestartDelay is how long a crashed replica stays down. Default 5s.
	RestartDelay time.Duration
	// PauseFor is how long the chaos scenario's pause fault keeps its
	// victim stopped (SIGSTOP, then SIGCONT). It must outlast the lease
	// duration, so that another replica takes the victim's shards over while
	// the victim cannot notice, and fit the chaos interval. Default lease
	// duration + 2 × retry period.
	PauseFor time.Duration
	// DelayFor is how long the chaos scenario's delay fault holds what its
	// victim sends to the API server before delivering it, and how long its
	// partition fault cuts the victim off both ways. It must outlast
	// the lease duration, so that the victim's Leases expire and move while
	// its writes are on the wire, and fit the chaos interval. Default lease
	// duration + 2 × retry period.
	DelayFor time.Duration
	// Faults lists the chaos scenario's fault kinds, comma-separated, in
	// the order of its rotation: kill, pause, clock, delay, partition and
	// apiserver-restart on replica processes; force-delete and delete on a
	// StatefulSet's pods. Default: every kind of the target, in that order
	// (without apiserver-restart on a cluster of Kubeconfig).
	Faults string
	// NoFencing leaves deploy/base's kshard-shard-writes policy unbound:
	// the sharded replicas still run on pod-bound tokens and deploy/base's
	// RBAC, but the API server no longer refuses a write by a pod that does
	// not hold the shard's Lease. With the delay fault, the late writes then
	// commit outside their writer's tenure, and the write check must fail:
	// how to see that the check can fail, and what the policy costs.
	NoFencing bool
	// ClockOffset is how far the chaos scenario's clock fault shifts its
	// victim's Lease clock (`kshard controller --lease-clock-offset`),
	// ahead and behind in turn. It must exceed the lease duration, so that a
	// replica judging expiry by the times written in Leases would take a
	// live Lease (behind) or wait on a dead one (ahead). Default 30s.
	ClockOffset time.Duration
	// MemoryLimit is passed to every kshard replica (`--memory-limit`, a
	// quantity such as 512Mi: the Go soft limit and the external cache are
	// sized from it), and the report divides each replica's peak resident
	// memory by it. Default 512Mi, the limit of deploy/base (the scale
	// scenario's 4Gi: its singleton caches 100,000 objects); "0" passes
	// none.
	MemoryLimit string
	// ReplicaCPU holds every replica process the load tester starts (the
	// plain controller's too) to this much CPU, a quantity such as 50m, in
	// a cgroup of its own (cgroup v1's CFS quota, as a container's CPU
	// limit): so that a fleet of n replicas has n times one replica's CPU
	// and the replicas, not the API server, are the bottleneck. Needs root
	// on a cgroup v1 host. Default none (the capacity scenario's 50m).
	ReplicaCPU string
	// SettleTimeout bounds every wait for the fleet to settle (all shards
	// held, every object reconciled and Ready). Default 5m: a busy two-core
	// machine is slow, and a slow settle is a number, a stuck one a failure.
	SettleTimeout time.Duration
	// CalibrateFor is how long the calibration phase patches ConfigBinding
	// status to measure the API server's write ceiling, once per run before
	// the first fleet starts (see Calibration). Default 5s; negative turns
	// it off (the flag's 0).
	CalibrateFor time.Duration
	// StopTimeout is how long a replica may take to hand over after SIGTERM
	// before it is killed. Default 45s.
	StopTimeout time.Duration

	// Fleets replaces the columns of compare-sharding and compare-external:
	// mode:replicas, comma-separated, with the modes sharded, off (sharding
	// off), plain (plain controller-runtime), cache, mirror and direct; for
	// example "off:1,sharded:4". Default: the scenario's own columns.
	Fleets string
	// ReplicaArgs are appended to every kshard replica's command line (a
	// plain fleet gets none), to measure what a flag does, such as
	// "--max-concurrent-reconciles=16". The report lists them.
	ReplicaArgs []string
	// Profile serves pprof on every replica (the plain controller's too),
	// takes a CPU profile of each over every measured phase and a heap
	// profile at its end, and writes them into the work folder's profiles/
	// (keep it with WorkDir).
	Profile bool

	// Out is the report folder. Default <repository>/loadtest/results.
	Out string
	// Kubeconfig targets an existing cluster instead of starting a control
	// plane. Its kubeconfig user must be allowed to read /metrics.
	Kubeconfig string
	// APIServerAuditLog is the audit log file of the Kubeconfig cluster's
	// API server, written under internal/audit's policy
	// (internal/audit/policy.yaml, --audit-log-format=json): the evidence
	// the write check reads. The node of `make cluster` writes
	// bin/cluster/log/kube-apiserver-audit.log. Without it, a run against
	// Kubeconfig has no evidence of the writes, and its write check fails
	// with "no data". The control plane a run starts writes its own.
	APIServerAuditLog string
	// NodeFaults is a command that injects faults of the node a
	// StatefulSet's pods run on: make cluster's hack/cluster/fault.sh.
	// With it, chaos on the pods also holds what a pod sends to the API
	// server for DelayFor (`hold on CONTAINER`, then `hold off`), cuts a
	// pod's network as long (`veth down CONTAINER`, then `veth up`) and
	// restarts the API server (`restart kube-apiserver`). StatefulSet only.
	NodeFaults string
	// StatefulSet, "namespace/name", makes the pods of that StatefulSet in
	// the Kubeconfig cluster the replicas, instead of processes the load
	// tester starts: it scales the StatefulSet, deletes pods for the chaos
	// faults, reads each container's audit records from its log (the pods
	// must run with --audit-log=-, as e2e/overlay adds to deploy/node) and
	// its metrics over HTTPS with a token of its own ServiceAccount, and
	// uses the config center of the StatefulSet's namespace. The Lease
	// timing and memory limit are the pods'. basic and chaos run this way.
	// Default: none.
	StatefulSet string
	// AssetsDir holds etcd and kube-apiserver for the control plane the run
	// starts. Default $KUBEBUILDER_ASSETS, else <repository>/bin/k8s.
	AssetsDir string
	// BinDir holds the kshard and configcenter binaries. Default: built
	// from the repository with `go build` into <repository>/bin/loadtest,
	// where a binary whose sources did not change is not linked again.
	BinDir string
	// WorkDir receives the replicas' logs and audit logs. Default: a new
	// temporary folder, removed after a successful run.
	WorkDir string
	// SampleInterval is how often replicas, the config center and the ring
	// are sampled, and Prometheus's scrape interval. Default 1s.
	SampleInterval time.Duration
	// Prometheus is the Prometheus server the run measures through.
	// Default $PROMETHEUS, else <repository>/bin/prometheus (make
	// prometheus-tools builds it from hack/prometheus's pinned module).
	Prometheus string

	// Command is the command line the report shows as the way to reproduce
	// it. Default: this process's arguments.
	Command string
	// Progress receives the progress line (redrawn in place on a terminal,
	// a line every 10 s elsewhere). Default os.Stderr; io.Discard silences it.
	Progress io.Writer
}

// defaultOptions are the load tester's defaults, each documented on its
// field of Options.
var defaultOptions = Options{
	Duration: time.Minute, Objects: 1000, Domains: 100, KeysPerDomain: 16, KeysPerObject: 2, Replicas: 3,
	CreateRate: 200, UpdateRate: 0.02, Skew: SkewUniform, ZipfS: 1.1, Seed: 1, ConfigCenter: CenterEtcd, ValueBytes: 256,
	Latency: 5 * time.Millisecond, Shards: sharding.DefaultShards, LeaseDuration: sharding.DefaultLeaseDuration,
	RenewDeadline: sharding.DefaultRenewDeadline, RetryPeriod: sharding.DefaultRetryPeriod,
	ChaosInterval: 30 * time.Second, RestartDelay: 5 * time.Second, ClockOffset: 30 * time.Second,
	MemoryLimit: DefaultMemoryLimit, SettleTimeout: 5 * time.Minute, StopTimeout: 45 * time.Second,
	CalibrateFor: 5 * time.Second, SampleInterval: time.Second,
}

// fillZero sets every zero field of o to d's.
func fillZero(o *Options, d Options) {
	ov, dv := reflect.ValueOf(o).Elem(), reflect.ValueOf(d)
	for i := range ov.NumField() {
		if f := ov.Field(i); f.IsZero() && f.CanSet() {
			f.Set(dv.Field(i))
		}
	}
}

// setDefaults fills the zero fields, the scenario's defaults before the
// load tester's, and validates the result.
func (o *Options) setDefaults(sc *scenario) error {
	fillZero(o, sc.defaults)
	sc.derive(o)
	fillZero(o, defaultOptions)
	// The faults' lengths follow the Lease timing.
	fillZero(o, Options{PauseFor: o.LeaseDuration + 2*o.RetryPeriod, DelayFor: o.LeaseDuration + 2*o.RetryPeriod})
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	if o.Command == "" {
		o.Command = strings.Join(os.Args, " ")
	}
	if o.Out == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return fmt.Errorf("defaulting the report folder (set it, or run from the repository): %w", err)
		}
		o.Out = filepath.Join(root, filepath.FromSlash(resultsFolder))
	}
	return o.validate(sc)
}

// validate rejects settings that cannot run, naming the flag-level field.
// The fault settings are checked only for a scenario that injects faults:
// their defaults follow the Lease timing, which another scenario may set
// freely.
func (o *Options) validate(sc *scenario) error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	check(o.Duration < 0, "duration %s must not be negative", o.Duration)
	check(o.Objects < 1 || o.Objects > 1_000_000, "objects %d must be within 1..1,000,000", o.Objects)
	check(o.Domains < 1 || o.Domains > 100_000, "domains %d must be within 1..100,000", o.Domains)
	check(o.KeysPerObject < 1 || o.KeysPerObject > 64, "keys per object %d must be within 1..64 (the API's limit)", o.KeysPerObject)
	check(o.KeysPerDomain <= o.KeysPerObject, "keys per domain %d must exceed keys per object %d, so that an update can change an object's keys", o.KeysPerDomain, o.KeysPerObject)
	check(o.Replicas < 1 || o.Replicas > 64, "replicas %d must be within 1..64", o.Replicas)
	check(o.Shards < 1 || o.Shards > 4096, "shards %d must be within 1..4096", o.Shards)
	check(!finite(o.CreateRate) || o.CreateRate <= 0, "create rate %v must be a positive number of objects per second", o.CreateRate)
	check(!finite(o.UpdateRate) || o.UpdateRate < 0, "update rate %v must be a non-negative number of updates per object per second", o.UpdateRate)
	check(o.Skew != SkewUniform && o.Skew != SkewZipf, "skew %q must be %q or %q", o.Skew, SkewUniform, SkewZipf)
	check(o.Skew == SkewZipf && (!finite(o.ZipfS) || o.ZipfS <= 1), "zipf exponent %v must be above 1", o.ZipfS)
	check(o.ValueBytes < 1 || o.ValueBytes > 1<<20, "value bytes %d must be within 1..1 MiB", o.ValueBytes)
	check(o.ValueChangeInterval < 0, "value change interval %s must not be negative", o.ValueChangeInterval)
	check(o.Latency < 0 || o.Jitter < 0, "latency %s and jitter %s must not be negative", o.Latency, o.Jitter)
	check(!finite(o.ErrorRate) || o.ErrorRate < 0 || o.ErrorRate > 1, "error rate %v must be within 0..1", o.ErrorRate)
	check(o.ConfigCenter != CenterEtcd && o.ConfigCenter != CenterHTTP, "config center %q must be %q or %q", o.ConfigCenter, CenterEtcd, CenterHTTP)
	check(o.ConfigCenter == CenterEtcd && (o.Jitter > 0 || o.ErrorRate > 0),
		"jitter %s and error rate %v need the stand-in config center (--config-center http): an etcd cannot be made to fail a share of requests", o.Jitter, o.ErrorRate)
	check(o.ConfigCenter == CenterEtcd && o.StatefulSet != "" && o.OutageFor > 0,
		"an outage (%s) of a cluster's etcd is not injected: its data lives in an emptyDir (deploy/config-etcd); run without --statefulset, or with --config-center http and deploy/configcenter", o.OutageFor)
	check(o.OutageAfter < 0 || o.OutageFor < 0, "outage times must not be negative")
	check(o.OutageFor > 0 && o.OutageAfter+o.OutageFor > o.Duration, "the outage (%s after the start, for %s) must end within the duration %s", o.OutageAfter, o.OutageFor, o.Duration)
	// The replicas refuse what sharding refuses: refused here, before any starts.
	if err := lease.ValidateTiming(o.LeaseDuration, o.RenewDeadline, o.RetryPeriod,
		lease.TimingNames{LeaseDuration: "lease duration", RenewDeadline: "renew deadline", RetryPeriod: "retry period"}); err != nil {
		errs = append(errs, err)
	}
	check(o.ChaosInterval <= 0 || o.RestartDelay < 0 || o.RestartDelay >= o.ChaosInterval, "restart delay %s must be below the chaos interval %s", o.RestartDelay, o.ChaosInterval)
	// Pauses and clock offsets are faults of replica processes; pods get
	// none (checkPodTarget).
	processFaults := sc.Faults && o.StatefulSet == ""
	check(processFaults && (o.PauseFor <= o.LeaseDuration || o.PauseFor >= o.ChaosInterval), "pause %s must outlast the lease duration %s and fit the chaos interval %s", o.PauseFor, o.LeaseDuration, o.ChaosInterval)
	check(processFaults && (o.DelayFor <= o.LeaseDuration || o.DelayFor >= o.ChaosInterval), "delay %s must outlast the lease duration %s and fit the chaos interval %s", o.DelayFor, o.LeaseDuration, o.ChaosInterval)
	check(o.NodeFaults != "" && o.StatefulSet == "", "node faults (%s) are for a StatefulSet's pods (--statefulset)", o.NodeFaults)
	if _, err := parseFaults(o.Faults, o.StatefulSet != "", o.NodeFaults != ""); err != nil {
		errs = append(errs, err)
	}
	check(o.Faults != "" && !sc.Faults, "faults %q: scenario %s injects none (chaos does)", o.Faults, sc.name)
	check(o.NoFencing && o.StatefulSet != "", "the fencing of a StatefulSet's pods is the cluster's: --no-fencing is for replica processes the load tester starts")
	check(processFaults && o.ClockOffset <= o.LeaseDuration, "clock offset %s must exceed the lease duration %s", o.ClockOffset, o.LeaseDuration)
	if _, err := o.memoryLimitBytes(); err != nil {
		errs = append(errs, err)
	}
	if _, err := o.replicaMillicores(); err != nil {
		errs = append(errs, err)
	}
	if _, err := parseFleets(o.Fleets); err != nil {
		errs = append(errs, err)
	}
	check(o.APIServerAuditLog != "" && o.Kubeconfig == "", "the API server audit log %s is for a cluster of --kubeconfig: the control plane a run starts writes its own", o.APIServerAuditLog)
	check(o.Fleets != "" && !sc.compares(), "fleets %q: scenario %s compares no fleets (compare-sharding and compare-external do)", o.Fleets, sc.name)
	check(o.CalibrateFor > 10*time.Minute, "calibration time %s must be at most 10m (seconds measure the ceiling)", o.CalibrateFor)
	check(o.SettleTimeout <= 0 || o.StopTimeout <= 0 || o.SampleInterval <= 0, "timeouts and the sample interval must be positive")
	return errors.Join(errs...)
}

// checkPodTarget rejects, before the defaults fill them, the settings a
// run on a StatefulSet's pods cannot honour.
func (o *Options) checkPodTarget(sc *scenario) error {
	var errs []error
	check := func(bad bool, format string, args ...any) {
		if bad {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(!sc.Pods, "scenario %s starts replica processes of its own; on a StatefulSet's pods, basic and chaos run", sc.name)
	check(o.Kubeconfig == "", "the StatefulSet %s needs the cluster that runs it (--kubeconfig)", o.StatefulSet)
	check(o.LeaseDuration != 0 || o.RenewDeadline != 0 || o.RetryPeriod != 0, "the lease timing is the StatefulSet's (its pods' flags), not the load tester's")
	check(len(o.ReplicaArgs) > 0 || o.Profile || o.BinDir != "" || o.ReplicaCPU != "", "replica arguments, CPU quotas, profiles and a binary folder are for replica processes the load tester starts")
	check(o.PauseFor != 0 || o.ClockOffset != 0 || o.RestartDelay != 0 || (o.DelayFor != 0 && o.NodeFaults == ""), "pauses, clock offsets, delays and restart delays need replica processes: on pods, chaos deletes pods (forced and with their grace period) and the StatefulSet recreates them at once, and with --node-faults delays or cuts a pod's network and restarts the API server")
	return errors.Join(errs...)
}

// centerFaults are the config center's faults the options ask for.
func (o *Options) centerFaults() configcenter.Faults {
	return configcenter.Faults{Latency: configcenter.Duration{Duration: o.Latency}, Jitter: configcenter.Duration{Duration: o.Jitter}, ErrorRate: o.ErrorRate}
}

// DefaultMemoryLimit is the memory limit of a replica in deploy/base.
const DefaultMemoryLimit = "512Mi"

// memoryLimitBytes is MemoryLimit in bytes, 0 for none ("0").
func (o *Options) memoryLimitBytes() (int64, error) {
	q, err := resource.ParseQuantity(o.MemoryLimit)
	if err != nil || q.Sign() < 0 {
		return 0, fmt.Errorf("memory limit %q must be a quantity such as 512Mi, or 0 for none", o.MemoryLimit)
	}
	return q.Value(), nil
}

// replicaMillicores is ReplicaCPU in thousandths of a CPU, 0 for none.
func (o *Options) replicaMillicores() (int64, error) {
	if o.ReplicaCPU == "" || o.ReplicaCPU == "0" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(o.ReplicaCPU)
	if err != nil || q.Sign() <= 0 {
		return 0, fmt.Errorf("replica CPU %q must be a quantity such as 50m, or 0 for none", o.ReplicaCPU)
	}
	return q.MilliValue(), nil
}

// scenarioNames lists the scenarios, sorted, for messages.
func scenarioNames() string {
	names := make([]string, 0, len(scenarios))
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// fleetModes names the modes Fleets may list.
var fleetModes = map[string]Mode{
	"sharded": ModeSharded, "off": ModeSingleton, "plain": ModePlain,
	"cache": ModeCache, "mirror": ModeMirror, "direct": ModeDirect,
	"authorized": ModeAuthorized,
}

// parseFleets reads Fleets; nil for "".
func parseFleets(s string) ([]fleetSpec, error) {
	if s == "" {
		return nil, nil
	}
	var out []fleetSpec
	for _, item := range strings.Split(s, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(item), ":")
		n, cold := strings.CutSuffix(n, ":cold")
		mode, known := fleetModes[name]
		replicas, err := strconv.Atoi(n)
		if !ok || !known || err != nil || replicas < 1 || replicas > 64 || (cold && !mode.Sharded()) {
			modes := slices.Sorted(maps.Keys(fleetModes))
			return nil, fmt.Errorf("fleet %q must be mode:replicas, mode one of %s and replicas within 1..64, or sharded:replicas:cold (on a cold shard table)", item, strings.Join(modes, ", "))
		}
		if mode.Plain && replicas != 1 {
			return nil, fmt.Errorf("fleet %q: the plain controller runs one active replica", item)
		}
		out = append(out, fleetSpec{Mode: mode, Replicas: replicas, ColdTable: cold})
	}
	return out, nil
}
