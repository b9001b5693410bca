package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// The calibration phase measures the API server's write ceiling on this
// machine, in the same run, so a fleet's write rate can be read as a share
// of what the server could take rather than as an absolute number that
// means something else on every machine.
const (
	// calibrationNamespace holds the calibration's throwaway ConfigBindings:
	// apart from Namespace, so the tracker never sees them, and emptied
	// before the first fleet starts, so no replica lists or reconciles them.
	calibrationNamespace = "loadtest-calibration"
	// calibrationWorkers is as many writers as the load generator has:
	// enough to keep the API server busy on a small machine.
	calibrationWorkers = loadWorkers
	// calibrationObjects gives every worker objects of its own, so no two
	// patches contend for one object (the API server would retry them
	// internally, which measures conflicts rather than throughput).
	calibrationObjects = 4 * calibrationWorkers
	// calibrationCleanupTimeout bounds the wait until the calibration's
	// objects are gone.
	calibrationCleanupTimeout = time.Minute
)

// Calibration is the API server's write ceiling measured at the start of the
// run: merge patches of ConfigBinding status (what the controller writes
// most) from many workers with no client-side rate limit, as fast as the
// server answers them, before any replica runs.
type Calibration struct {
	// Duration is how long the workers patched (--calibrate-for); zero when
	// the calibration was off.
	Duration time.Duration
	// Elapsed is from the first patch until the last one answered: the
	// patches in flight at the end of Duration count, and so does their time.
	Elapsed          time.Duration
	Workers, Objects int
	// Patches counts the status patches the API server accepted; Errors the
	// ones it refused or that failed.
	Patches, Errors int64
	// WritesPerSec is Patches per second of Elapsed: the ceiling. Every
	// patch is one write, so it is the ceiling in writes per second too.
	WritesPerSec float64
	// P50 and P99 are one patch's latency under that load.
	P50, P99 time.Duration
	// Error says why there is no ceiling (setup or every patch failed).
	Error string `json:",omitempty"`
}

// measured says the calibration produced a ceiling.
func (c *Calibration) measured() bool { return c != nil && c.Error == "" && c.WritesPerSec > 0 }

// ceilingRate is writes per second over an interval; 0 for an empty one.
func ceilingRate(writes int64, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(writes) / elapsed.Seconds()
}

// calibrate runs the calibration phase when it is on. A failure to measure
// is recorded in the result (the ceiling's rows say n/a) and the run goes
// on; a failure to remove the calibration's objects fails the run, because
// every fleet would list them, and sharded ones label and reconcile them.
func calibrate(ctx context.Context, restConfig *rest.Config, d time.Duration, progress *progress) (*Calibration, error) {
	if d <= 0 {
		return nil, nil
	}
	cfg := rest.CopyConfig(restConfig)
	// No client-side limit: the ceiling is the server's. (The copy keeps the
	// writeCounter: these patches count as the load tester's own, and no
	// write mark is taken before the calibration ends.)
	cfg.QPS, cfg.Burst = -1, 0
	c, err := client.New(cfg, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("creating the calibration's API client: %w", err)
	}
	progress.printf("calibrating the API server's write ceiling: %d workers patching the status of %d throwaway ConfigBindings for %s ...", calibrationWorkers, calibrationObjects, d)
	cal := &Calibration{Duration: d, Workers: calibrationWorkers, Objects: calibrationObjects}
	measureErr := calibrationPatches(ctx, c, cal)
	cleanupErr := cleanupCalibration(context.WithoutCancel(ctx), c)
	if measureErr != nil {
		cal.Error = measureErr.Error()
		progress.printf("calibration failed, the ceiling rows will say n/a: %v", measureErr)
	} else {
		progress.printf("API server write ceiling: %.0f status patches/s (%d in %s, %d errors; p50 %s, p99 %s per patch)",
			cal.WritesPerSec, cal.Patches, round(cal.Elapsed), cal.Errors, fmtDur(cal.P50), fmtDur(cal.P99))
	}
	if cleanupErr != nil {
		return cal, fmt.Errorf("removing the calibration's ConfigBindings (every fleet would list them): %w", cleanupErr)
	}
	return cal, nil
}

// calibrationPatches creates the throwaway objects and patches their status
// for cal.Duration, filling in cal.
func calibrationPatches(ctx context.Context, c client.Client, cal *Calibration) error {
	names, err := createCalibrationObjects(ctx, c, cal.Objects)
	if err != nil {
		return err
	}
	var patches, failures atomic.Int64
	var lastErr atomic.Value
	hists := make([]durations, calibrationWorkers)
	start := time.Now()
	deadline := start.Add(cal.Duration)
	var wg sync.WaitGroup
	for w := range calibrationWorkers {
		wg.Go(func() {
			for k := int64(1); time.Now().Before(deadline) && ctx.Err() == nil; k++ {
				i := w + int(k%int64(cal.Objects/calibrationWorkers))*calibrationWorkers
				body, err := calibrationStatus(k)
				if err != nil {
					failures.Add(1)
					lastErr.Store(err.Error())
					return
				}
				cb := &configv1alpha1.ConfigBinding{ObjectMeta: metav1.ObjectMeta{Namespace: calibrationNamespace, Name: names[i]}}
				t0 := time.Now()
				pctx, cancel := context.WithTimeout(ctx, writeTimeout)
				err = c.Status().Patch(pctx, cb, client.RawPatch(types.MergePatchType, body))
				cancel()
				if err != nil {
					failures.Add(1)
					lastErr.Store(err.Error())
					continue
				}
				hists[w] = append(hists[w], time.Since(t0))
				patches.Add(1)
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	cal.Elapsed = time.Since(start)
	cal.Patches, cal.Errors = patches.Load(), failures.Load()
	cal.WritesPerSec = ceilingRate(cal.Patches, cal.Elapsed)
	all := slices.Concat(hists...).summary()
	cal.P50, cal.P99 = all.P50, all.P99
	if cal.Patches == 0 {
		last, _ := lastErr.Load().(string)
		return fmt.Errorf("no status patch succeeded in %s (%d failed; the last: %s)", cal.Duration, cal.Errors, last)
	}
	return nil
}

// createCalibrationObjects creates the calibration's namespace and its n
// throwaway ConfigBindings, and returns their names.
func createCalibrationObjects(ctx context.Context, c client.Client, n int) ([]string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: calibrationNamespace}}
	if err := c.Create(ctx, ns); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating namespace %s: %w", calibrationNamespace, err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(ns), ns); err != nil {
			return nil, fmt.Errorf("reading namespace %s: %w", calibrationNamespace, err)
		}
		if ns.DeletionTimestamp != nil {
			return nil, fmt.Errorf("namespace %s is being deleted (a previous run's?); wait until it is gone", calibrationNamespace)
		}
	}
	names := make([]string, n)
	var wg sync.WaitGroup
	errs := make([]error, calibrationWorkers)
	for w := range calibrationWorkers {
		wg.Go(func() {
			for i := w; i < n; i += calibrationWorkers {
				names[i] = fmt.Sprintf("calibration-%03d", i)
				cb := &configv1alpha1.ConfigBinding{
					ObjectMeta: metav1.ObjectMeta{Namespace: calibrationNamespace, Name: names[i]},
					Spec: configv1alpha1.ConfigBindingSpec{
						Domain: "calibration",
						Keys:   []configv1alpha1.ConfigKey{"key-0"},
						Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: names[i]},
					},
				}
				if err := c.Create(ctx, cb); err != nil && !apierrors.IsAlreadyExists(err) {
					errs[w] = fmt.Errorf("creating ConfigBinding %s/%s: %w", calibrationNamespace, names[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	return names, errors.Join(errs...)
}

// calibrationStatus is the k-th status patch of a worker: a Ready condition
// as the controller writes it, and a revision that changes with every patch,
// so each one is a real write (the API server skips a patch that changes
// nothing without writing to etcd).
func calibrationStatus(k int64) ([]byte, error) {
	body, err := json.Marshal(map[string]any{"status": map[string]any{
		"observedGeneration": 1,
		"resolvedRevision":   k,
		"conditions": []metav1.Condition{{
			Type: configbinding.ConditionReady, Status: metav1.ConditionTrue, Reason: configbinding.ReasonSynced,
			Message: "calibration", ObservedGeneration: 1, LastTransitionTime: metav1.Unix(0, 0),
		}},
	}})
	if err != nil {
		return nil, fmt.Errorf("encoding a calibration status patch: %w", err)
	}
	return body, nil
}

// cleanupCalibration deletes the calibration's ConfigBindings, waits until
// the API server lists none, and deletes their namespace. Without a
// controller manager (the load tester's own control plane) the namespace
// stays Terminating, empty; it holds nothing a fleet lists.
func cleanupCalibration(ctx context.Context, c client.Client) error {
	ctx, cancel := context.WithTimeout(ctx, calibrationCleanupTimeout)
	defer cancel()
	if err := c.DeleteAllOf(ctx, &configv1alpha1.ConfigBinding{}, client.InNamespace(calibrationNamespace)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the ConfigBindings of namespace %s: %w", calibrationNamespace, err)
	}
	for {
		var left metav1.PartialObjectMetadataList
		left.SetGroupVersionKind(bindingListGVK)
		err := c.List(ctx, &left, client.InNamespace(calibrationNamespace))
		if err == nil && len(left.Items) == 0 {
			break
		}
		if err == nil {
			err = fmt.Errorf("%d ConfigBindings left in namespace %s (e.g. %s)", len(left.Items), calibrationNamespace, left.Items[0].Name)
		}
		if sleep(ctx, settlePoll) != nil {
			return fmt.Errorf("waiting for the calibration's ConfigBindings to go: %w", err)
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: calibrationNamespace}}
	if err := c.Delete(ctx, ns); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting namespace %s: %w", calibrationNamespace, err)
	}
	return nil
}
