package loadtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
)

// Run runs a scenario and writes its report into opts.Out: the Markdown
// file, its SVG charts and a JSON copy of the numbers. It starts (or
// targets) a control plane, starts the config center and the replicas as
// child processes, drives the load, and stops every process it started on
// every way out, a cancelled ctx included.
//
// The returned error is about the run itself (a process that would not
// start, a fleet that never settled, an interruption). A run that completed
// but whose checks failed returns its Report with Passed false and no
// error; callers exit non-zero on either.
func Run(ctx context.Context, opts Options) (*Report, error) {
	sc, ok := scenarios[opts.Scenario]
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q; the scenarios are %s", opts.Scenario, scenarioNames())
	}
	if opts.StatefulSet != "" {
		// Before the defaults: the Lease timing is the StatefulSet's.
		if err := opts.checkPodTarget(sc); err != nil {
			return nil, fmt.Errorf("scenario %s: %w", opts.Scenario, err)
		}
	}
	if err := opts.setDefaults(sc); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", opts.Scenario, err)
	}
	r := &run{opts: opts, sc: sc, log: logr.FromContextOrDiscard(ctx).WithName("loadtest")}
	r.chosen, _ = parseFleets(opts.Fleets) // validated by setDefaults
	if r.chosen == nil {
		r.chosen, _ = sc.fleets(opts.Replicas) // validated when loaded
	}
	r.faults = newFaults(r)
	return r.run(ctx)
}

// run is one load test: what it started, so it can stop all of it, and what
// it measured.
type run struct {
	opts Options
	// chosen are the comparison's columns: Options.Fleets, else the
	// scenario's.
	chosen []fleetSpec
	// concluders state a scenario's goals against the run once every
	// figure is in (the scale scenario's findings).
	concluders []func(context.Context)
	sc         *scenario
	log        logr.Logger
	// faults are what the run breaks, and what it broke.
	faults *faults

	work       string
	begin      time.Time
	kubeconfig string
	kshardBin  string
	centerBin  string
	// plainBin is cmd/plaincontroller, for a scenario with a plain fleet
	// (scenario.plain); empty otherwise.
	plainBin string

	restConfig    *rest.Config
	serverVersion string
	// controlPlaneGOGC is the GOGC of the control plane the run started
	// ("" for a --kubeconfig cluster).
	controlPlaneGOGC string
	// apiAuditLog is the API server's audit log under internal/audit's
	// Policy, the evidence of the write check: the one the run's own
	// control plane writes, or Options.APIServerAuditLog; empty without
	// one.
	apiAuditLog string
	c           client.Client
	cs          kubernetes.Interface
	rc          rest.Interface
	procs       *childproc.Supervisor
	// cpuQuota holds the replica processes to Options.ReplicaCPU; nil
	// without one.
	cpuQuota *cpuQuota
	// pods is the StatefulSet whose pods are the replicas
	// (Options.StatefulSet); nil when the load tester starts them as
	// processes.
	pods *podTarget
	// fencing is deploy/base's identity and fencing policy, under which the
	// sharded replica processes run; nil on a StatefulSet's pods.
	fencing *fencing
	// apiAddr is the API server's "host:port", which the proxies of the
	// delay fault forward to.
	apiAddr string
	// center is the config center (Options.ConfigCenter, or the cluster's
	// on a StatefulSet's pods).
	center center
	// ownWrites counts the writes of ConfigBindings and ConfigMaps the load
	// tester sent through any client built from restConfig, so the API
	// server's counts can be split into the replicas' and its own.
	ownWrites atomic.Int64
	// ownSyncs counts the initial syncs of ConfigBindings the load tester's
	// own watch made, for the same split of the API server's counts.
	ownSyncs atomic.Int64

	// obs are the load tester's own observations as metrics; prom the
	// Prometheus that scrapes them with everything else, and queries what
	// the report asks it.
	obs     *observations
	prom    *promServer
	queries querySet

	set     *objectSet
	tracker *tracker
	ring    *ringWatch
	gen     *generator
	audit   *auditTail
	// propagation probes config-center changes (--value-change-interval).
	propagation *propagation
	// authz is the run's SpiceDB, nil unless a fleet is authorized.
	authz *authorization

	mu     sync.Mutex
	fleet  *fleet
	fleets []*fleet
	phase  string

	report   *Report
	progress *progress
	// calibration is the API server's write ceiling, measured before the
	// first fleet; nil when turned off.
	calibration *Calibration
}

func (r *run) run(parent context.Context) (*Report, error) {
	// ctx also ends when a child exits on its own or a background goroutine
	// panics, so every wait fails fast with the cause.
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)

	if err := r.folders(); err != nil {
		return nil, err
	}
	r.progress = newProgress(r.opts.Progress)
	defer r.progress.close()
	var err error
	if r.obs, err = newObservations(&r.ownWrites, &r.ownSyncs); err != nil {
		return nil, err
	}
	defer r.obs.close()
	r.progress.printf("scenario %s; work folder %s", r.opts.Scenario, r.work)

	if r.opts.StatefulSet == "" {
		if err := r.binaries(ctx); err != nil {
			return nil, err
		}
	}

	stopCluster, etcdURL, err := r.cluster(ctx)
	if err != nil {
		return nil, err
	}
	defer stopCluster()
	// The load tester's own watches end before the API server stops.
	defer cancel(nil)

	// The delay fault's proxies close after the children stopped (defers
	// run in reverse), so that a stopping replica reaches the API server.
	defer r.faults.closeProxies()
	// Children stop before the cluster (defers run in reverse): replicas
	// hand over while the API server still answers.
	removeQuota, err := r.startCPUQuota()
	if err != nil {
		return nil, err
	}
	// After the children stopped (defers run in reverse): a cgroup with a
	// process in it cannot be removed.
	defer removeQuota()
	r.procs = childproc.NewSupervisor(func(err error) { cancel(err) })
	defer func() {
		r.progress.printf("stopping every child process ...")
		r.procs.StopAll(r.opts.StopTimeout)
	}()

	if err := r.prepare(ctx); err != nil {
		if r.pods != nil {
			r.restorePods(context.WithoutCancel(ctx))
		}
		return nil, err
	}
	if r.pods != nil {
		// After the fleets stopped (scaled to 0): the cluster gets its
		// replicas back.
		defer r.restorePods(context.WithoutCancel(ctx))
	}
	// Before anything else loads the machine, and before any replica runs:
	// the ceiling is the API server's alone, and its throwaway objects are
	// gone before the first fleet lists ConfigBindings.
	if r.calibration, err = calibrate(ctx, r.restConfig, r.opts.CalibrateFor, r.progress); err != nil {
		return nil, err
	}
	if err := r.startCenter(ctx); err != nil {
		return nil, err
	}
	err = r.startAuthorization(ctx)
	if r.authz != nil {
		defer r.authz.close()
	}
	if err != nil {
		return nil, err
	}
	if err := r.startMeasuring(ctx, etcdURL); err != nil {
		return nil, err
	}
	if err := r.watch(ctx); err != nil {
		return nil, err
	}
	r.report = r.newReport(ctx)

	scenarioErr := r.runScenario(ctx, cancel)
	if parent.Err() != nil {
		return nil, fmt.Errorf("interrupted; no report written: %w", context.Cause(parent))
	}
	return r.conclude(ctx, scenarioErr)
}

// runScenario runs the scenario with the sampler beside it, and leaves
// every fleet stopped, its numbers final. Its error is the scenario's, or
// why ctx ended.
func (r *run) runScenario(ctx context.Context, cancel context.CancelCauseFunc) error {
	r.begin = time.Now()
	stopFollowing := childproc.GoSafe(ctx, cancel, "Prometheus targets", r.followTargets)
	defer stopFollowing()
	err := r.runSteps(ctx)
	if err == nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	// The last API server restart's relist window ends with the scenario.
	r.faults.closeRestartWindow(ctx)
	// Stop whatever fleet still runs (an error left it), so its numbers are
	// final, then stop sampling.
	if f := r.currentFleet(); f != nil && f.result == nil {
		r.stopFleet(context.WithoutCancel(ctx), f)
	}
	return err
}

// startCPUQuota puts the replicas under the CPU quota the options ask for,
// if any, and returns how to remove it.
func (r *run) startCPUQuota() (remove func(), err error) {
	m, _ := r.opts.replicaMillicores()
	if m <= 0 {
		return func() {}, nil
	}
	if r.cpuQuota, err = newCPUQuota(m); err != nil {
		return nil, err
	}
	return func() {
		if err := r.cpuQuota.remove(); err != nil {
			r.progress.printf("%v", err)
		}
	}, nil
}

// folders creates the work folder (a temporary one unless WorkDir names
// it) and the report folder.
func (r *run) folders() error {
	r.work = r.opts.WorkDir
	if r.work == "" {
		dir, err := os.MkdirTemp("", "kshard-loadtest-")
		if err != nil {
			return fmt.Errorf("creating the work folder: %w", err)
		}
		r.work = dir
	}
	for _, d := range []string{"logs", "audit", "bin"} {
		if err := os.MkdirAll(filepath.Join(r.work, d), 0o755); err != nil {
			return fmt.Errorf("creating the work folder: %w", err)
		}
	}
	if err := os.MkdirAll(r.opts.Out, 0o755); err != nil {
		return fmt.Errorf("creating the report folder: %w", err)
	}
	return nil
}

// watch starts what the load tester watches and writes with: the object
// tracker, the ring's Leases, the audit tail, the objects and their
// generator, and the propagation probe.
func (r *run) watch(ctx context.Context) error {
	var err error
	if r.tracker, err = newTracker(ctx, rest.CopyConfig(r.restConfig), r.opts.Shards, r.obs, &r.ownSyncs); err != nil {
		return err
	}
	ns, ring, byHolder := LeaseNamespace, Ring, (func(string) *instance)(nil)
	if r.pods != nil {
		ns, ring, byHolder = r.pods.namespace, r.pods.ring, r.instanceOfHolder
	}
	if r.ring, err = newRingWatch(ctx, rest.CopyConfig(r.restConfig), ns, ring, r.opts.Shards, r.processOf, byHolder); err != nil {
		return err
	}
	r.audit = newAuditTail()
	r.set = newObjectSet(r.opts, r.sc.SplitKeys)
	r.gen = newGenerator(r.c, r.set, r.tracker)
	if r.opts.ValueChangeInterval > 0 {
		wc, err := client.NewWithWatch(r.restConfig, client.Options{Scheme: replica.Scheme()})
		if err != nil {
			return fmt.Errorf("creating the ConfigMap watch client: %w", err)
		}
		r.propagation = newPropagation(wc, r.center, r.set, r.gen, r.obs)
	}
	return nil
}

// conclude writes the report of a scenario that ran to its end (or
// failed) and says how it went; the work folder goes when the run passed
// and no WorkDir keeps it.
func (r *run) conclude(ctx context.Context, scenarioErr error) (*Report, error) {
	// The run's own context may have ended with a child's exit; the
	// report's queries still have Prometheus to ask.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	r.finish(ctx, scenarioErr)
	if err := r.writeReport(); err != nil {
		return r.report, err
	}
	r.progress.printf("report: %s", filepath.Join(r.opts.Out, r.opts.Scenario+".md"))
	if scenarioErr != nil {
		r.progress.printf("logs kept in %s", r.work)
		return r.report, fmt.Errorf("scenario %s: %w", r.opts.Scenario, scenarioErr)
	}
	if r.report.Passed && r.opts.WorkDir == "" {
		// Stop the children first: they write into the folder.
		r.procs.StopAll(r.opts.StopTimeout)
		_ = os.RemoveAll(r.work)
	} else if !r.report.Passed {
		r.progress.printf("checks failed; logs and audit logs kept in %s", r.work)
	}
	return r.report, nil
}

// needsPlain says whether a fleet of the run is the plain controller: the
// scenario's own, or one --fleets lists.
func (r *run) needsPlain() bool {
	return hasPlain(r.chosen)
}

// binaries builds kshard, configcenter for a run on the stand-in, and
// plaincontroller for a scenario with a plain fleet, unless BinDir has
// them.
func (r *run) binaries(ctx context.Context) error {
	names := []string{"kshard"}
	if r.opts.ConfigCenter == CenterHTTP && r.opts.StatefulSet == "" {
		names = append(names, "configcenter")
	}
	if r.needsPlain() {
		names = append(names, "plaincontroller")
	}
	dir := r.opts.BinDir
	if dir != "" {
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("--bin-dir: %w (build them with `make build` or omit --bin-dir)", err)
			}
		}
	} else {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return fmt.Errorf("building the binaries (or give --bin-dir): %w", err)
		}
		dir = filepath.Join(root, "bin", "loadtest")
		r.progress.printf("building %s into %s ...", strings.Join(names, ", "), dir)
		start := time.Now()
		if _, err := childproc.Build(ctx, root, dir, names...); err != nil {
			return err
		}
		r.progress.printf("built in %s", time.Since(start).Round(100*time.Millisecond))
	}
	r.kshardBin, r.centerBin = filepath.Join(dir, "kshard"), filepath.Join(dir, "configcenter")
	if r.needsPlain() {
		r.plainBin = filepath.Join(dir, "plaincontroller")
	}
	return nil
}

// cluster starts the control plane, or loads the kubeconfig of an existing
// one, and returns how to stop what it started.
func (r *run) cluster(ctx context.Context) (stop func(), etcdURL string, err error) {
	var cfg *rest.Config
	stop = func() {}
	if r.opts.Kubeconfig != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", r.opts.Kubeconfig); err != nil {
			return nil, "", fmt.Errorf("loading --kubeconfig %s: %w", r.opts.Kubeconfig, err)
		}
		r.kubeconfig, r.apiAuditLog = r.opts.Kubeconfig, r.opts.APIServerAuditLog
		r.progress.printf("using the cluster of %s", r.kubeconfig)
	} else {
		r.kubeconfig = filepath.Join(r.work, "kubeconfig")
		r.progress.printf("starting the control plane (etcd + kube-apiserver) ...")
		start := time.Now()
		r.apiAuditLog = filepath.Join(r.work, "apiserver-audit.log")
		// Go's default GOGC, as a cluster's API server runs: the tests'
		// 400 makes its heap grow to five times what is live, and the
		// reports' memory of the API server would be the tests' setting.
		r.controlPlaneGOGC = "100"
		if env, ok := os.LookupEnv("GOGC"); ok {
			r.controlPlaneGOGC = env
		}
		cp, err := controlplane.Start(controlplane.Options{AssetsDir: r.opts.AssetsDir, KubeconfigPath: r.kubeconfig, UseExistingCluster: new(bool),
			AuditLogPath: r.apiAuditLog, RestartLogPath: filepath.Join(r.work, "logs", "kube-apiserver-restarted.log"), GOGC: r.controlPlaneGOGC})
		if err != nil {
			return nil, "", err
		}
		stop = func() {
			r.progress.printf("stopping the control plane ...")
			if err := cp.Stop(); err != nil {
				r.log.Error(err, "Stopping the control plane")
			}
		}
		cfg = cp.Config
		r.faults.restartServer = cp.RestartAPIServer
		etcdURL = cp.EtcdURL()
		r.progress.printf("control plane ready in %s", time.Since(start).Round(100*time.Millisecond))
	}
	if r.opts.NodeFaults != "" {
		r.faults.restartServer = func(ctx context.Context) error { return restartNodeAPIServer(ctx, r.opts.NodeFaults, cfg) }
	}
	host := cfg.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	u, err := url.Parse(host)
	if err != nil || u.Host == "" {
		stop()
		return nil, "", fmt.Errorf("the API server's address %q: want https://host:port (%v)", cfg.Host, err)
	}
	r.apiAddr = u.Host
	cfg = rest.CopyConfig(cfg)
	// The load tester's own writes must measure the API server, not
	// client-go's default limit of 5 requests per second.
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &writeCounter{next: rt, n: &r.ownWrites} })
	r.restConfig = cfg
	if r.c, err = client.New(cfg, client.Options{Scheme: replica.Scheme()}); err != nil {
		stop()
		return nil, "", fmt.Errorf("creating the API client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		stop()
		return nil, "", fmt.Errorf("creating the API client: %w", err)
	}
	r.cs, r.rc = cs, cs.RESTClient()
	if v, err := cs.Discovery().ServerVersion(); err == nil {
		r.serverVersion = v.GitVersion
	}
	return stop, etcdURL, nil
}

// prepare creates the namespaces and the StatefulSet, and refuses a cluster
// that already holds the load tester's objects (a previous run's leftovers
// would skew every number).
func (r *run) prepare(ctx context.Context) error {
	if err := r.ensureNamespace(ctx, Namespace, map[string]string{targetsLabel: "enabled"}); err != nil {
		return err
	}
	if r.opts.StatefulSet == "" {
		if err := r.ensureNamespace(ctx, LeaseNamespace, nil); err != nil {
			return err
		}
	}
	var existing metav1.PartialObjectMetadataList
	existing.SetGroupVersionKind(bindingListGVK)
	if err := r.c.List(ctx, &existing, client.InNamespace(Namespace), client.Limit(1)); err != nil {
		return fmt.Errorf("checking namespace %s: %w", Namespace, err)
	}
	if len(existing.Items) > 0 {
		return fmt.Errorf("namespace %s already holds ConfigBindings (a previous run's?): delete it first (kubectl delete namespace %s %s)", Namespace, Namespace, LeaseNamespace)
	}
	if r.opts.StatefulSet != "" {
		return r.preparePods(ctx)
	}
	if err := r.ensureStatefulSet(ctx); err != nil {
		return err
	}
	var err error
	r.fencing, err = installFencing(ctx, r.c, r.opts, r.kubeconfig, r.work)
	return err
}

// targetsLabel opts a namespace in to kshard's ConfigMap writes where
// deploy/base's admission policy runs; the load tester's objects and their
// ConfigMaps live in Namespace.
const targetsLabel = "kshard.dev/targets"

// ensureNamespace creates a namespace with labels, or adds them to one that
// exists.
func (r *run) ensureNamespace(ctx context.Context, name string, labels map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	err := r.c.Create(ctx, ns)
	if err == nil || !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("creating namespace %s: %w", name, err)
		}
		return nil
	}
	if err := r.c.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		return fmt.Errorf("reading namespace %s: %w", name, err)
	}
	if ns.DeletionTimestamp != nil {
		return fmt.Errorf("namespace %s is being deleted (a previous run's?): wait until it is gone", name)
	}
	missing := false
	for k, v := range labels {
		if ns.Labels[k] != v {
			missing = true
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			ns.Labels[k] = v
		}
	}
	if missing {
		if err := r.c.Update(ctx, ns); err != nil {
			return fmt.Errorf("labelling namespace %s: %w", name, err)
		}
	}
	return nil
}

// startCenter starts the run's config center with its data and faults
// (Options.ConfigCenter), or on a StatefulSet's pods takes the cluster's.
func (r *run) startCenter(ctx context.Context) error {
	var err error
	switch {
	case r.pods != nil:
		r.center, err = r.pods.connectCenter(ctx, r.opts, r.work)
	case r.opts.ConfigCenter == CenterHTTP:
		r.center, err = startHTTPCenter(ctx, r.opts, r.procs, r.centerBin, r.work)
	default:
		r.center, err = startEtcdCenter(ctx, r.opts, r.work)
	}
	if err != nil {
		return err
	}
	r.progress.printf("config center: %s", r.center)
	return nil
}

// bindingListGVK lists ConfigBindings as metadata only.
var bindingListGVK = configv1alpha1.GroupVersion.WithKind("ConfigBindingList")

// loadtestCaller names the load tester in the config center's counts, so
// its own requests are told from the replicas'.
const loadtestCaller = "loadtest"

// currentFleet is the fleet running now, nil between fleets.
func (r *run) currentFleet() *fleet {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fleet
}

// processOf is the newest process of replica id, in any fleet of the run,
// started at or before at; nil if none. Fleets run one after another, so
// the newest is the one that ran then, if any did.
func (r *run) processOf(id string, at time.Time) *instance {
	r.mu.Lock()
	fleets := slices.Clone(r.fleets)
	r.mu.Unlock()
	var newest *instance
	for _, f := range fleets {
		if in := f.processOf(id, at); in != nil && (newest == nil || in.proc.Started().After(newest.proc.Started())) {
			newest = in
		}
	}
	return newest
}

// mark prints an event of the run in the progress output.
func (r *run) mark(format string, args ...any) {
	r.progress.printf("%s  %s", r.elapsed(), fmt.Sprintf(format, args...))
}

func (r *run) setPhase(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phase = fmt.Sprintf(format, args...)
}

// elapsed is the run's clock, for messages.
func (r *run) elapsed() string {
	if r.begin.IsZero() {
		return "[setup]"
	}
	return "[" + time.Since(r.begin).Round(time.Second).String() + "]"
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// errSettle marks a settle that timed out; the run reports it as a failed
// check rather than stopping.
var errSettle = errors.New("did not settle")
