package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/childproc"
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
	r := &run{bench: &bench{opts: opts, log: logr.FromContextOrDiscard(ctx).WithName("loadtest")}, sc: sc}
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
	*bench
	// chosen are the comparison's columns: Options.Fleets, else the
	// scenario's.
	chosen []fleetSpec
	// concluders state a scenario's goals against the run once every
	// figure is in (the scale scenario's findings).
	concluders []func(context.Context)
	sc         *scenario
	// faults are what the run breaks, and what it broke.
	faults *faults
	begin  time.Time

	set     *objectSet
	tracker *tracker
	ring    *ringWatch
	gen     *generator
	audit   *auditTail
	// propagation probes config-center changes (--value-change-interval).
	propagation *propagation

	fleets fleetLog

	mu    sync.Mutex
	phase string

	report *Report
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
		if err := r.binaries(ctx, hasPlain(r.chosen)); err != nil {
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

	if err := r.prepare(ctx, r.fleets.containerStarted); err != nil {
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
	err = r.startAuthorization(ctx, hasAuthorized(r.chosen))
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
	r.report = reporter{r}.newReport(ctx)

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
	if f := r.fleets.running(); f != nil && f.result == nil {
		r.stopFleet(context.WithoutCancel(ctx), f)
	}
	return err
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
		ns, ring, byHolder = r.pods.namespace, r.pods.ring, func(holder string) *instance {
			if c := r.pods.containerOf(holder); c != nil {
				return r.fleets.instanceOf(c)
			}
			return nil
		}
	}
	if r.ring, err = newRingWatch(ctx, rest.CopyConfig(r.restConfig), ns, ring, r.opts.Shards, r.fleets.processOf, byHolder); err != nil {
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
	rp := reporter{r}
	rp.finish(ctx, scenarioErr)
	if err := rp.writeReport(); err != nil {
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

// targetsLabel opts a namespace in to kshard's ConfigMap writes where
// deploy/base's admission policy runs; the load tester's objects and their
// ConfigMaps live in Namespace.
const targetsLabel = "kshard.dev/targets"

// bindingListGVK lists ConfigBindings as metadata only.
var bindingListGVK = configv1alpha1.GroupVersion.WithKind("ConfigBindingList")

// loadtestCaller names the load tester in the config center's counts, so
// its own requests are told from the replicas'.
const loadtestCaller = "loadtest"

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
