package sharding_test

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
	"github.com/kshard/kshard/sharding/ring"
)

var cp *controlplane.ControlPlane

// Environment of a replica process: the test binary re-executed with these
// set runs one replica instead of the tests, so a test can SIGKILL it.
const (
	envReplica    = "KSHARD_TEST_REPLICA"
	envKubeconfig = "KSHARD_TEST_KUBECONFIG"
	envNamespace  = "KSHARD_TEST_NAMESPACE"
	envRing       = "KSHARD_TEST_RING"
	envAudit      = "KSHARD_TEST_AUDIT"
	envTiming     = "KSHARD_TEST_TIMING"
)

// apiAudit is the shared control plane's own audit log (internal/audit's
// Policy): what the API server committed, to check the replicas' writes
// against the Leases.
var apiAudit string

// TestMain shares one control plane. Tests that count the API server's
// requests or read the whole cluster run alone, first; the others, each with
// its own namespace, ring and Leases, run in parallel after them, four at a
// time unless -parallel says otherwise.
func TestMain(m *testing.M) {
	if id := os.Getenv(envReplica); id != "" {
		os.Exit(runReplicaProcess(id))
	}
	flag.Parse()
	setDefaultParallel(defaultParallel)
	// The managers' own errors (a reconcile that failed, a cache that
	// could not sync) reach the test's output; their chatter does not.
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel), zap.StacktraceLevel(zapcore.DPanicLevel)))
	dir, err := os.MkdirTemp("", "kshard-sharding-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	apiAudit = filepath.Join(dir, "audit.log")
	code := controlplane.RunTestsWith(m, &cp, controlplane.Options{AuditLogPath: apiAudit})
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// defaultParallel is how many of the package's parallel tests run at once.
// They mostly wait, for Lease expiry, handovers and replica processes, so
// Go's default, GOMAXPROCS (two here), kept the package's own run at 90 s
// where four take 65 s, for the same CPU time.
const defaultParallel = 4

// setDefaultParallel sets -test.parallel to n unless the command line set it.
func setDefaultParallel(n int) {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", fmt.Sprint(n))
	}
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = configv1alpha1.AddToScheme(s)
	return s
}

func newClient(t testing.TB) client.Client {
	t.Helper()
	controlplane.Require(t, cp)
	c, err := client.New(cp.Config, client.Options{Scheme: newScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newNamespace(t testing.TB, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "sharding-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// timing is a lease timing short enough for tests to see several handovers.
type timing struct{ lease, renew, retry time.Duration }

var fastTiming = timing{lease: 6 * time.Second, renew: 4 * time.Second, retry: time.Second}

func (tm timing) String() string { return fmt.Sprintf("%s/%s/%s", tm.lease, tm.renew, tm.retry) }

func parseTiming(s string) timing {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return fastTiming
	}
	var tm timing
	var errs [3]error
	tm.lease, errs[0] = time.ParseDuration(parts[0])
	tm.renew, errs[1] = time.ParseDuration(parts[1])
	tm.retry, errs[2] = time.ParseDuration(parts[2])
	if errs[0] != nil || errs[1] != nil || errs[2] != nil {
		return fastTiming
	}
	return tm
}

// replicaConfig says how to run one replica.
type replicaConfig struct {
	id, namespace, ring string
	shards              int32
	timing              timing
	statefulSet         string
	audit               *os.File
	restConfig          *rest.Config
	// clockSkew shifts the wall clock the replica writes into Leases.
	clockSkew time.Duration
	// ownedSelector narrows the owned ConfigMaps' informers, forSelector
	// the ConfigBindings'.
	ownedSelector, forSelector labels.Selector
	// tenures, when set, records the replica's OnAcquire and OnRelease.
	tenures *tenureLog
	// everyNamespace watches every namespace, as a controller deployed
	// without --namespaces does. Otherwise the replica watches its test's
	// namespace only: tests run in parallel on one control plane, and a
	// replica that saw another test's objects would label and reconcile
	// them. Only a test that runs alone may set it.
	everyNamespace bool
	// shardTable names the shard table the labeler keeps.
	shardTable string
	// labelPrefix is the ring's label prefix (default kshard.dev), and
	// metricsPrefix its metric names' (default kshard).
	labelPrefix, metricsPrefix string
}

// tenureLog records OnAcquire ("+") and OnRelease ("-") per shard, in order.
type tenureLog struct {
	mu     sync.Mutex
	events map[int32]string
}

func (l *tenureLog) record(shard int32, ev string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == nil {
		l.events = map[int32]string{}
	}
	l.events[shard] += ev
}

// check counts the shards with hooks and reports those whose hooks did not
// alternate "+-+-…" starting with OnAcquire, and, when ended, those whose
// last tenure did not end.
func (l *tenureLog) check(ended bool) (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var bad []string
	for n, evs := range l.events {
		ok := len(evs) > 0
		for i, ev := range evs {
			ok = ok && ((i%2 == 0) == (ev == '+'))
		}
		if !ok || (ended && len(evs)%2 != 0) {
			bad = append(bad, fmt.Sprintf("shard %d: %s", n, evs))
		}
	}
	return len(l.events), bad
}

// skewedClock is the system clock off by a fixed amount, as on a machine
// whose time sync failed.
type skewedClock struct{ by time.Duration }

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.by) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// replica is a running replica with its manager.
type replica struct {
	id     string
	rep    *sharding.Replica
	trace  *reconcileTrace
	cancel context.CancelFunc
	done   chan struct{} // closed when the manager returned, with err set
	err    error
}

func (r *replica) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		if r.err != nil {
			t.Errorf("replica %s: %v", r.id, r.err)
		}
	case <-time.After(2 * time.Minute):
		t.Errorf("replica %s did not stop", r.id)
	}
}

// newReplica builds the manager, Replica and recording controller of one
// replica, as any controller using the library would.
func newReplica(rc replicaConfig) (*replica, manager.Manager, error) {
	// As kshard does: the holder identity in the user agent, so that the
	// API server's audit log names the process behind each write.
	incarnation := lease.NewIncarnation()
	cfg := rest.CopyConfig(rc.restConfig)
	cfg.UserAgent = audit.UserAgent(rest.DefaultKubernetesUserAgent(), lease.Holder(rc.id, incarnation))
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme:                  newScheme(),
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
		GracefulShutdownTimeout: ptr.To(time.Minute),
	})
	if err != nil {
		return nil, nil, err
	}
	opts := sharding.Options{
		Ring:           rc.ring,
		Identity:       rc.id,
		Incarnation:    incarnation,
		LeaseNamespace: rc.namespace,
		Shards:         rc.shards,
		LeaseDuration:  rc.timing.lease,
		RenewDeadline:  rc.timing.renew,
		RetryPeriod:    rc.timing.retry,
		For:            sharding.Kind{Object: &configv1alpha1.ConfigBinding{}, Selector: rc.forSelector},
		Owns:           []sharding.Kind{{Object: &corev1.ConfigMap{}, Selector: rc.ownedSelector}},
		Domain:         func(o client.Object) string { return o.(*configv1alpha1.ConfigBinding).Spec.Domain },
		StatefulSet:    rc.statefulSet,
		ShardTable:     rc.shardTable,
		LabelPrefix:    rc.labelPrefix,
		MetricsPrefix:  rc.metricsPrefix,
	}
	if !rc.everyNamespace {
		opts.Namespaces = []string{rc.namespace}
	}
	if rc.clockSkew != 0 {
		opts.Clock = skewedClock{rc.clockSkew}
	}
	if rc.tenures != nil {
		opts.OnAcquire = func(_ context.Context, n int32) { rc.tenures.record(n, "+") }
		opts.OnRelease = func(n int32) { rc.tenures.record(n, "-") }
	}
	if rc.audit != nil {
		opts.AuditLog = rc.audit
	}
	rep, err := sharding.New(mgr, opts)
	if err != nil {
		return nil, nil, err
	}
	rec := &statusReconciler{rep: rep, client: mgr.GetClient(), trace: &reconcileTrace{}}
	// A reconcile that failed is retried within seconds, as kshard's own
	// controller does within --requeue-max-delay: with controller-runtime's
	// default (up to 1,000 s) an object whose reconciles failed a dozen
	// times on a starved machine would wait past a test's patience.
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[sharding.Request](5*time.Millisecond, 5*time.Second)
	if _, err := rep.NewController("recorder", rec, controller.TypedOptions[sharding.Request]{MaxConcurrentReconciles: 4, RateLimiter: limiter}); err != nil {
		return nil, nil, err
	}
	return &replica{id: rc.id, rep: rep, trace: rec.trace}, mgr, nil
}

func startReplica(t testing.TB, rc replicaConfig) *replica {
	t.Helper()
	controlplane.Require(t, cp)
	if rc.restConfig == nil {
		rc.restConfig = cp.Config
	}
	r, mgr, err := newReplica(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctrl.LoggerInto(context.Background(), zap.New(zap.UseDevMode(true))))
	r.cancel, r.done = cancel, make(chan struct{})
	go func() { defer close(r.done); r.err = mgr.Start(ctx) }()
	t.Cleanup(func() {
		if t.Failed() {
			n, unsettled := r.trace.unsettled()
			t.Logf("replica %s reconciled %d requests; %d unsettled: %s", r.id, n, len(unsettled), strings.Join(unsettled[:min(len(unsettled), 10)], " | "))
		}
		r.cancel()
		<-r.done
	})
	return r
}

// statusReconciler is the smallest useful sharded reconciler: it reads the
// object from its shard's cache and records, in status, the generation it
// saw and which shard and replica saw it (the replica in a condition of its
// own: the API has no field for it, as a real reconciler needs none).
type statusReconciler struct {
	rep    *sharding.Replica
	client client.Client
	trace  *reconcileTrace
}

func (r *statusReconciler) Reconcile(ctx context.Context, req sharding.Request) (res reconcile.Result, err error) {
	outcome := "patched"
	defer func() {
		if err != nil {
			outcome = "error: " + err.Error()
		}
		r.trace.record(req, outcome)
	}()
	reader, ok := r.rep.Reader(req.Shard)
	if !ok {
		outcome = "no reader"
		return reconcile.Result{}, nil
	}
	var cb configv1alpha1.ConfigBinding
	if err := reader.Get(ctx, req.NamespacedName, &cb); err != nil {
		if apierrors.IsNotFound(err) {
			outcome = "not in the shard's cache"
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	// A little work, so that overlapping reconciles would have a window.
	time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	if cb.Status.ObservedGeneration == cb.Generation && ptr.Deref(cb.Status.Shard, -1) == req.Shard && reconciledBy(&cb) == r.rep.Identity() {
		outcome = "current"
		return reconcile.Result{}, nil
	}
	patch := client.MergeFromWithOptions(cb.DeepCopy(), client.MergeFromWithOptimisticLock{})
	cb.Status.ObservedGeneration = cb.Generation
	cb.Status.Shard = ptr.To(req.Shard)
	meta.SetStatusCondition(&cb.Status.Conditions, metav1.Condition{Type: conditionReconciledBy, Status: metav1.ConditionTrue,
		Reason: "Reconciled", Message: r.rep.Identity(), ObservedGeneration: cb.Generation})
	wctx, done, ok := r.rep.WriteContext(ctx, req.Shard)
	if !ok {
		outcome = "may not write"
		return reconcile.Result{}, nil
	}
	err = r.client.Status().Patch(wctx, &cb, patch)
	done()
	if err != nil {
		if apierrors.IsConflict(err) {
			// Our cache is behind: look again when it has caught up.
			outcome = "conflict"
			return reconcile.Result{RequeueAfter: 250 * time.Millisecond}, nil
		}
		if apierrors.IsNotFound(err) {
			outcome = "deleted"
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// reconcileTrace keeps the last outcomes of each object's reconciles in one
// replica, so that a test that finds an object never reconciled can say
// whether its requests arrived and what became of them.
type reconcileTrace struct {
	mu     sync.Mutex
	events map[sharding.Request][]string
}

func (tr *reconcileTrace) record(req sharding.Request, outcome string) {
	if tr == nil {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.events == nil {
		tr.events = map[sharding.Request][]string{}
	}
	evs := append(tr.events[req], time.Now().Format("15:04:05.000")+" "+outcome)
	tr.events[req] = evs[max(0, len(evs)-6):]
}

// unsettled names the requests whose last reconcile neither wrote status
// nor found it current, with their recent outcomes.
func (tr *reconcileTrace) unsettled() (requests int, out []string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for req, evs := range tr.events {
		if last := evs[len(evs)-1]; !strings.HasSuffix(last, " patched") && !strings.HasSuffix(last, " current") {
			out = append(out, fmt.Sprintf("%s: %s", req, strings.Join(evs, "; ")))
		}
	}
	sort.Strings(out)
	return len(tr.events), out
}

// conditionReconciledBy is the test reconciler's record of who reconciled an
// object last: its message is the replica.
const conditionReconciledBy = "ReconciledBy"

func reconciledBy(cb *configv1alpha1.ConfigBinding) string {
	if c := meta.FindStatusCondition(cb.Status.Conditions, conditionReconciledBy); c != nil {
		return c.Message
	}
	return ""
}

// runReplicaProcess is the body of a replica process.
func runReplicaProcess(id string) int {
	ctrl.SetLogger(zap.New(zap.UseDevMode(true)))
	kc, err := clientcmd.BuildConfigFromFlags("", os.Getenv(envKubeconfig))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	kc.QPS = -1 // as ctrl.GetConfig does: the API server's fairness is the limit

	rc := replicaConfig{id: id, namespace: os.Getenv(envNamespace), ring: os.Getenv(envRing), shards: shardsOf(os.Getenv(envRing)),
		timing: parseTiming(os.Getenv(envTiming)), restConfig: kc}
	if path := os.Getenv(envAudit); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		rc.audit = f
	}
	_, mgr, err := newReplica(rc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// replicaProcess is a replica running as a child process.
type replicaProcess struct {
	id  string
	cmd *exec.Cmd
}

func startReplicaProcess(t testing.TB, id, ns, ring string, tm timing, audit string) *replicaProcess {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeconfigBytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envReplica+"="+id, envKubeconfig+"="+kubeconfig, envNamespace+"="+ns,
		envRing+"="+ring, envAudit+"="+audit, envTiming+"="+tm.String())
	logFile, err := os.Create(filepath.Join(t.TempDir(), id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &replicaProcess{id: id, cmd: cmd}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			if out, err := os.ReadFile(logFile.Name()); err == nil && len(out) > 0 {
				tail := out[max(0, len(out)-4000):]
				t.Logf("log of replica %s (tail):\n%s", id, tail)
			}
		}
	})
	return p
}

func (p *replicaProcess) kill(t testing.TB) time.Time {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = p.cmd.Wait()
	return killed
}

// shardHolders reads every shard Lease of a ring.
func shardHolders(t testing.TB, c client.Client, ns, ring string) map[int32]coordinationv1.Lease {
	t.Helper()
	var list coordinationv1.LeaseList
	if err := c.List(context.Background(), &list, client.InNamespace(ns),
		client.MatchingLabels{sharding.LabelRing: ring, sharding.LabelLeaseKind: lease.KindShard}); err != nil {
		t.Fatal(err)
	}
	out := map[int32]coordinationv1.Lease{}
	for _, l := range list.Items {
		if n, ok := lease.ParseShardName(ring, l.Name, shardsOf(ring)); ok {
			out[n] = l
		}
	}
	return out
}

// holderOf is the replica holding a Lease.
func holderOf(l coordinationv1.Lease) string { return lease.HolderReplica(holderIdentity(l)) }

// holderIdentity is a Lease's holder as written: "<replica>_<incarnation>".
func holderIdentity(l coordinationv1.Lease) string { return ptr.Deref(l.Spec.HolderIdentity, "") }

func leaseExpiry(l coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second)
}

// createBindings creates n ConfigBindings spread over domains, unlabeled:
// the labeler stamps them.
func createBindings(t testing.TB, c client.Client, ns string, n, domains int) []client.ObjectKey {
	t.Helper()
	var keys []client.ObjectKey
	for i := range n {
		cb := &configv1alpha1.ConfigBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cb-%d", i)},
			Spec: configv1alpha1.ConfigBindingSpec{
				Domain: fmt.Sprintf("domain-%d", i%domains),
				Keys:   []configv1alpha1.ConfigKey{"k"},
				Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: fmt.Sprintf("cm-%d", i)},
			},
		}
		if err := c.Create(context.Background(), cb); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, client.ObjectKeyFromObject(cb))
	}
	// A later test's replicas may watch every namespace: leave them nothing.
	t.Cleanup(func() {
		if err := c.DeleteAllOf(context.Background(), &configv1alpha1.ConfigBinding{}, client.InNamespace(ns)); err != nil {
			t.Errorf("deleting the test's ConfigBindings: %v", err)
		}
	})
	return keys
}

// allReconciled reports whether every binding in ns has its current
// generation recorded in status by the replica holding its shard now.
func allReconciled(c client.Client, ns, ring string, t testing.TB) error {
	var list configv1alpha1.ConfigBindingList
	if err := c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return err
	}
	holders := shardHolders(t, c, ns, ring)
	// Every object that is not yet so, counted, with a few named: one
	// object left behind (a stuck key) reads differently from a slow fleet.
	var not []string
	for _, cb := range list.Items {
		if err := reconciledByHolder(&cb, ring, holders); err != nil {
			not = append(not, err.Error())
		}
	}
	if len(not) > 0 {
		return fmt.Errorf("%d of %d objects not reconciled by their shard's holder, e.g. %s", len(not), len(list.Items), strings.Join(not[:min(len(not), 3)], "; "))
	}
	return nil
}

// reconciledByHolder says why an object is not labeled for its domain's
// shard, or not reconciled at its generation by that shard's holder.
func reconciledByHolder(cb *configv1alpha1.ConfigBinding, ringName string, holders map[int32]coordinationv1.Lease) error {
	shard, ok := ring.KeysFor(sharding.DefaultLabelPrefix).ShardLabel(cb.Labels, shardsOf(ringName))
	if !ok {
		return fmt.Errorf("%s has no valid shard label: %v", cb.Name, cb.Labels)
	}
	if want := sharding.ShardOf(cb.Spec.Domain, shardsOf(ringName)); shard != want {
		return fmt.Errorf("%s labeled shard %d, its domain maps to %d", cb.Name, shard, want)
	}
	if cb.Status.ObservedGeneration != cb.Generation {
		return fmt.Errorf("%s: generation %d observed %d", cb.Name, cb.Generation, cb.Status.ObservedGeneration)
	}
	if got := ptr.Deref(cb.Status.Shard, -1); got != shard {
		return fmt.Errorf("%s: status shard %d, label %d", cb.Name, got, shard)
	}
	if h := holderOf(holders[shard]); reconciledBy(cb) != h {
		return fmt.Errorf("%s: reconciled by %q, shard %d held by %q", cb.Name, reconciledBy(cb), shard, h)
	}
	return nil
}

// interval is one reconcile of one object by one replica.
type interval struct {
	replica    string
	start, end time.Time
	generation int64
}

// readAudit merges audit logs into intervals per object. A start with no end
// (the replica was killed) lasts until killedAt[replica].
func readAudit(t testing.TB, killedAt map[string]time.Time, paths ...string) map[string][]interval {
	t.Helper()
	type key struct{ replica, object string }
	open := map[key][]sharding.AuditRecord{}
	out := map[string][]interval{}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var rec sharding.AuditRecord
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				continue // a line cut by SIGKILL
			}
			obj := rec.Namespace + "/" + rec.Name
			k := key{rec.Replica, obj}
			switch rec.Event {
			case "start":
				open[k] = append(open[k], rec)
			case "end":
				// Reconciles of one object on one replica never run
				// concurrently (the work queue guarantees it), so the
				// oldest open start is this end's.
				if starts := open[k]; len(starts) > 0 {
					out[obj] = append(out[obj], interval{replica: rec.Replica, start: starts[0].Time, end: rec.Time, generation: starts[0].Generation})
					open[k] = starts[1:]
				}
			}
		}
		f.Close()
	}
	for k, starts := range open {
		for _, s := range starts {
			end, ok := killedAt[k.replica]
			if !ok {
				end = time.Now()
			}
			out[k.object] = append(out[k.object], interval{replica: k.replica, start: s.Time, end: end, generation: s.Generation})
		}
	}
	return out
}

// overlaps lists pairs of intervals of one object on different replicas
// that intersect.
func overlaps(byObject map[string][]interval) []string {
	var found []string
	for obj, ivs := range byObject {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].start.Before(ivs[j].start) })
		for i := range ivs {
			for j := i + 1; j < len(ivs) && ivs[j].start.Before(ivs[i].end); j++ {
				if ivs[i].replica != ivs[j].replica {
					found = append(found, fmt.Sprintf("%s: %s [%s, %s] and %s [%s, %s]", obj,
						ivs[i].replica, ivs[i].start.Format(time.StampMicro), ivs[i].end.Format(time.StampMicro),
						ivs[j].replica, ivs[j].start.Format(time.StampMicro), ivs[j].end.Format(time.StampMicro)))
				}
			}
		}
	}
	return found
}

// updateContinuously changes the spec of the objects, one after another,
// until the returned stop is called; stop waits for the last update and
// returns how many succeeded. Stop is also called at the end of the test.
func updateContinuously(t testing.TB, c client.Client, keys []client.ObjectKey) (stop func() int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var updates atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			key := keys[i%len(keys)]
			var cb configv1alpha1.ConfigBinding
			if err := c.Get(ctx, key, &cb); err != nil {
				continue
			}
			cb.Spec.Keys = []configv1alpha1.ConfigKey{configv1alpha1.ConfigKey(fmt.Sprintf("k%d", i))}
			if c.Update(ctx, &cb) == nil {
				updates.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stop = func() int64 {
		cancel()
		<-done
		return updates.Load()
	}
	t.Cleanup(func() { stop() })
	return stop
}
