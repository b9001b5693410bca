package loadtest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/internal/spicedbserver"
)

// bench is what a run runs on, set up once before its scenario and torn
// down at its end: the work folder, the binaries, the cluster and the
// load tester's clients of it, the child processes under their CPU quota,
// the config center, SpiceDB, the fence or the pods of a StatefulSet, and
// the Prometheus that measures all of it with the load tester's own
// metrics. The run drives fleets on it; nothing here knows the scenario.
type bench struct {
	opts     Options
	log      logr.Logger
	progress *progress

	work       string
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
	// restartAPIServer restarts the control plane's kube-apiserver: nil on
	// a cluster the load tester did not start and cannot restart.
	restartAPIServer func(context.Context) error
	// authz is the run's SpiceDB, nil unless a fleet is authorized.
	authz *authorization
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
}

// folders creates the work folder (a temporary one unless WorkDir names
// it) and the report folder.
func (b *bench) folders() error {
	b.work = b.opts.WorkDir
	if b.work == "" {
		dir, err := os.MkdirTemp("", "kshard-loadtest-")
		if err != nil {
			return fmt.Errorf("creating the work folder: %w", err)
		}
		b.work = dir
	}
	for _, d := range []string{"logs", "audit", "bin"} {
		if err := os.MkdirAll(filepath.Join(b.work, d), 0o755); err != nil {
			return fmt.Errorf("creating the work folder: %w", err)
		}
	}
	if err := os.MkdirAll(b.opts.Out, 0o755); err != nil {
		return fmt.Errorf("creating the report folder: %w", err)
	}
	return nil
}

// binaries builds kshard, configcenter for a run on the stand-in, and
// plaincontroller for a scenario with a plain fleet, unless BinDir has
// them.
func (b *bench) binaries(ctx context.Context, plain bool) error {
	names := []string{"kshard"}
	if b.opts.ConfigCenter == CenterHTTP && b.opts.StatefulSet == "" {
		names = append(names, "configcenter")
	}
	if plain {
		names = append(names, "plaincontroller")
	}
	dir := b.opts.BinDir
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
		b.progress.printf("building %s into %s ...", strings.Join(names, ", "), dir)
		start := time.Now()
		if _, err := childproc.Build(ctx, root, dir, names...); err != nil {
			return err
		}
		b.progress.printf("built in %s", time.Since(start).Round(100*time.Millisecond))
	}
	b.kshardBin, b.centerBin = filepath.Join(dir, "kshard"), filepath.Join(dir, "configcenter")
	if plain {
		b.plainBin = filepath.Join(dir, "plaincontroller")
	}
	return nil
}

// cluster starts the control plane, or loads the kubeconfig of an existing
// one, and returns how to stop what it started.
func (b *bench) cluster(ctx context.Context) (stop func(), etcdURL string, err error) {
	var cfg *rest.Config
	stop = func() {}
	if b.opts.Kubeconfig != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", b.opts.Kubeconfig); err != nil {
			return nil, "", fmt.Errorf("loading --kubeconfig %s: %w", b.opts.Kubeconfig, err)
		}
		b.kubeconfig, b.apiAuditLog = b.opts.Kubeconfig, b.opts.APIServerAuditLog
		b.progress.printf("using the cluster of %s", b.kubeconfig)
	} else {
		b.kubeconfig = filepath.Join(b.work, "kubeconfig")
		b.progress.printf("starting the control plane (etcd + kube-apiserver) ...")
		start := time.Now()
		b.apiAuditLog = filepath.Join(b.work, "apiserver-audit.log")
		// Go's default GOGC, as a cluster's API server runs: the tests'
		// 400 makes its heap grow to five times what is live, and the
		// reports' memory of the API server would be the tests' setting.
		b.controlPlaneGOGC = "100"
		if env, ok := os.LookupEnv("GOGC"); ok {
			b.controlPlaneGOGC = env
		}
		cp, err := controlplane.Start(controlplane.Options{AssetsDir: b.opts.AssetsDir, KubeconfigPath: b.kubeconfig, UseExistingCluster: new(bool),
			AuditLogPath: b.apiAuditLog, RestartLogPath: filepath.Join(b.work, "logs", "kube-apiserver-restarted.log"), GOGC: b.controlPlaneGOGC})
		if err != nil {
			return nil, "", err
		}
		stop = func() {
			b.progress.printf("stopping the control plane ...")
			if err := cp.Stop(); err != nil {
				b.log.Error(err, "Stopping the control plane")
			}
		}
		cfg = cp.Config
		b.restartAPIServer = cp.RestartAPIServer
		etcdURL = cp.EtcdURL()
		b.progress.printf("control plane ready in %s", time.Since(start).Round(100*time.Millisecond))
	}
	if b.opts.NodeFaults != "" {
		b.restartAPIServer = func(ctx context.Context) error { return restartNodeAPIServer(ctx, b.opts.NodeFaults, cfg) }
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
	b.apiAddr = u.Host
	cfg = rest.CopyConfig(cfg)
	// The load tester's own writes must measure the API server, not
	// client-go's default limit of 5 requests per second.
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &writeCounter{next: rt, n: &b.ownWrites} })
	b.restConfig = cfg
	if b.c, err = client.New(cfg, client.Options{Scheme: replica.Scheme()}); err != nil {
		stop()
		return nil, "", fmt.Errorf("creating the API client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		stop()
		return nil, "", fmt.Errorf("creating the API client: %w", err)
	}
	b.cs, b.rc = cs, cs.RESTClient()
	if v, err := cs.Discovery().ServerVersion(); err == nil {
		b.serverVersion = v.GitVersion
	}
	return stop, etcdURL, nil
}

// startCPUQuota puts the replicas under the CPU quota the options ask for,
// if any, and returns how to remove it.
func (b *bench) startCPUQuota() (remove func(), err error) {
	m, _ := b.opts.replicaMillicores()
	if m <= 0 {
		return func() {}, nil
	}
	if b.cpuQuota, err = newCPUQuota(m); err != nil {
		return nil, err
	}
	return func() {
		if err := b.cpuQuota.remove(); err != nil {
			b.progress.printf("%v", err)
		}
	}, nil
}

// prepare creates the namespaces and the StatefulSet, and refuses a cluster
// that already holds the load tester's objects (a previous run's leftovers
// would skew every number).
func (b *bench) prepare(ctx context.Context, onStart func(ordinal int, c *container)) error {
	if err := b.ensureNamespace(ctx, Namespace, map[string]string{targetsLabel: "enabled"}); err != nil {
		return err
	}
	if b.opts.StatefulSet == "" {
		if err := b.ensureNamespace(ctx, LeaseNamespace, nil); err != nil {
			return err
		}
	}
	var existing metav1.PartialObjectMetadataList
	existing.SetGroupVersionKind(bindingListGVK)
	if err := b.c.List(ctx, &existing, client.InNamespace(Namespace), client.Limit(1)); err != nil {
		return fmt.Errorf("checking namespace %s: %w", Namespace, err)
	}
	if len(existing.Items) > 0 {
		return fmt.Errorf("namespace %s already holds ConfigBindings (a previous run's?): delete it first (kubectl delete namespace %s %s)", Namespace, Namespace, LeaseNamespace)
	}
	if b.opts.StatefulSet != "" {
		return b.preparePods(ctx, onStart)
	}
	if err := b.ensureStatefulSet(ctx); err != nil {
		return err
	}
	var err error
	b.fencing, err = installFencing(ctx, b.c, b.opts, b.kubeconfig, b.work)
	return err
}

// ensureNamespace creates a namespace with labels, or adds them to one that
// exists.
func (b *bench) ensureNamespace(ctx context.Context, name string, labels map[string]string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	err := b.c.Create(ctx, ns)
	if err == nil || !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("creating namespace %s: %w", name, err)
		}
		return nil
	}
	if err := b.c.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
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
		if err := b.c.Update(ctx, ns); err != nil {
			return fmt.Errorf("labelling namespace %s: %w", name, err)
		}
	}
	return nil
}

// preparePods takes over the StatefulSet: reads it, lets the load tester
// read its pods' metrics, follows its pods, and scales it to 0 until the
// first fleet starts (the calibration runs with no replica, and every
// fleet starts from none).
func (b *bench) preparePods(ctx context.Context, onStart func(ordinal int, c *container)) error {
	t, err := newPodTarget(ctx, b.cs, b.opts.StatefulSet, filepath.Join(b.work, "logs"), &b.opts)
	if err != nil {
		return err
	}
	if err := t.authorize(ctx, Namespace); err != nil {
		return err
	}
	b.pods = t
	t.onStart = onStart
	if err := t.watch(ctx); err != nil {
		return err
	}
	b.progress.printf("replicas: the pods of StatefulSet %s/%s (image %s, ring %s), %d now; scaled to 0 until the first fleet, back to %d at the end",
		t.namespace, t.name, t.image, t.ring, t.restoreReplicas, t.restoreReplicas)
	if err := t.scale(ctx, 0); err != nil {
		return err
	}
	return t.waitFor(ctx, b.opts.StopTimeout+containerLogGrace, "the StatefulSet's pods gone", func() bool { return t.runningCount() == 0 })
}

// ensureStatefulSet creates the inert StatefulSet the replicas consult.
func (b *bench) ensureStatefulSet(ctx context.Context) error {
	labels := map[string]string{"app.kubernetes.io/name": "kshard-loadtest"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: StatefulSet},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(int32(0)),
			ServiceName: StatefulSet,
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:  "kshard",
					Image: "kshard:loadtest-processes-not-pods",
				}}},
			},
		},
	}
	if err := b.c.Create(ctx, sts); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating StatefulSet %s/%s: %w", LeaseNamespace, StatefulSet, err)
	}
	return nil
}

// setDesired writes the StatefulSet's desired replica count, which replicas
// read when they stop: below it they restart (keep their shards' place),
// at or above it they leave.
func (b *bench) setDesired(ctx context.Context, n int) error {
	var sts appsv1.StatefulSet
	if err := b.c.Get(ctx, client.ObjectKey{Namespace: LeaseNamespace, Name: StatefulSet}, &sts); err != nil {
		return fmt.Errorf("reading StatefulSet %s: %w", StatefulSet, err)
	}
	if ptr.Deref(sts.Spec.Replicas, 1) == int32(n) {
		return nil
	}
	sts.Spec.Replicas = ptr.To(int32(n))
	if err := b.c.Update(ctx, &sts); err != nil {
		return fmt.Errorf("scaling StatefulSet %s to %d: %w", StatefulSet, n, err)
	}
	return nil
}

// restorePods scales the StatefulSet back to its size before the run and
// gives the config center its faults back.
func (b *bench) restorePods(ctx context.Context) {
	t := b.pods
	if err := t.scale(ctx, int(t.restoreReplicas)); err != nil {
		b.log.Error(err, "Restoring the StatefulSet's replicas")
	} else {
		b.progress.printf("StatefulSet %s/%s scaled back to %d", t.namespace, t.name, t.restoreReplicas)
	}
	if h, ok := b.center.(*httpCenter); ok && t.centerFaults != nil {
		if err := h.cc.SetFaults(ctx, *t.centerFaults); err != nil {
			b.log.Error(err, "Restoring the config center's faults")
		}
	}
}

// startCenter starts the run's config center with its data and faults
// (Options.ConfigCenter), or on a StatefulSet's pods takes the cluster's.
func (b *bench) startCenter(ctx context.Context) error {
	var err error
	switch {
	case b.pods != nil:
		b.center, err = b.pods.connectCenter(ctx, b.opts, b.work)
	case b.opts.ConfigCenter == CenterHTTP:
		b.center, err = startHTTPCenter(ctx, b.opts, b.procs, b.centerBin, b.work)
	default:
		b.center, err = startEtcdCenter(ctx, b.opts, b.work)
	}
	if err != nil {
		return err
	}
	b.progress.printf("config center: %s", b.center)
	return nil
}

// startAuthorization starts SpiceDB with its grants, and creates the grant
// probes' bindings, if a fleet of the run is authorized.
func (b *bench) startAuthorization(ctx context.Context, authorized bool) error {
	if !authorized {
		return nil
	}
	if b.pods != nil {
		return fmt.Errorf("an authorized fleet runs on processes: the pods ask their cluster's SpiceDB (deploy/spicedb)")
	}
	if b.opts.Domains < grantProbes {
		return fmt.Errorf("an authorized fleet needs at least %d domains (--domains), one per grant probe, not %d", grantProbes, b.opts.Domains)
	}
	dir := filepath.Join(b.work, "spicedb")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating SpiceDB's folder: %w", err)
	}
	srv, err := spicedbserver.Start(ctx, spicedbserver.Options{Dir: dir, Token: "kshard-loadtest"})
	if err != nil {
		return err
	}
	a := &authorization{server: srv}
	b.authz = a
	if a.grants, err = spicedbserver.Dial(srv.ClientOptions()); err != nil {
		return err
	}
	if err := a.grants.WriteSchema(ctx); err != nil {
		return err
	}
	rels := []string{"team:loadtest#member@kubernetes/namespace:" + Namespace}
	for i := range b.opts.Domains {
		rels = append(rels, "configdomain:"+configcenter.SeedDomain(i)+"#reader@team:loadtest#member")
	}
	for i := range grantProbes {
		rels = append(rels, probeGrant(i))
	}
	if err := a.grants.Touch(ctx, rels...); err != nil {
		return err
	}
	if err := b.ensureNamespace(ctx, GrantNamespace, map[string]string{targetsLabel: "enabled"}); err != nil {
		return err
	}
	for i := range grantProbes {
		cb := grantProbe(i)
		if err := b.c.Create(ctx, cb); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating grant probe %s/%s: %w", cb.Namespace, cb.Name, err)
		}
	}
	b.progress.printf("authorization: SpiceDB at %s (in memory): namespace %s reads the %d domains through team loadtest; %s reads domain-0…%d by direct grants, revoked and given back during an authorized fleet's load",
		srv.Endpoint(), Namespace, b.opts.Domains, GrantNamespace, grantProbes-1)
	return nil
}

// startMeasuring starts what the report's figures come from: the load
// tester's own metrics and the Prometheus that scrapes them with the
// replicas, the API server, its etcd and the config center.
func (b *bench) startMeasuring(ctx context.Context, etcdURL string) error {
	var err error
	if b.queries, err = loadQueries(); err != nil {
		return err
	}
	dir := filepath.Join(b.work, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating Prometheus's folder: %w", err)
	}
	o := promOptions{binary: b.opts.Prometheus, dir: dir, interval: b.opts.SampleInterval,
		tester: promScrape{addr: b.obs.addr}}
	if o.apiServer, err = apiServerScrape(b.restConfig, b.apiAddr, dir); err != nil {
		return err
	}
	if etcdURL != "" {
		if u, err := url.Parse(etcdURL); err == nil {
			o.etcd = promScrape{addr: u.Host, scheme: u.Scheme}
		}
	}
	if job, s := b.center.scrape(); job == jobConfigEtcd {
		o.configEtcd = s
	} else {
		o.configCenter = s
	}
	if b.authz != nil {
		o.spicedb = promScrape{addr: b.authz.server.Metrics()}
	}
	if b.pods != nil {
		token := filepath.Join(dir, "replicas.token")
		if err := os.WriteFile(token, []byte(b.pods.metricsToken), 0o600); err != nil {
			return fmt.Errorf("writing the replicas' scrape token: %w", err)
		}
		// The replicas serve a self-signed certificate (deploy/base
		// without deploy/metrics-cert): what is read is counters.
		o.replicas = promScrape{scheme: "https", tokenFile: token, insecure: true}
	}
	b.progress.printf("starting Prometheus ...")
	if b.prom, err = startPrometheus(ctx, b.procs, o); err != nil {
		return err
	}
	b.progress.printf("Prometheus at %s scrapes every %s (the API server and its etcd every %s)", b.prom.url, o.interval, b.prom.controlPlane)
	return nil
}

// shardTableDomains counts the domains in the labeler's shard table; -1
// when there is none.
func (b *bench) shardTableDomains(ctx context.Context) (int, error) {
	var cm corev1.ConfigMap
	err := b.c.Get(ctx, client.ObjectKey{Namespace: LeaseNamespace, Name: replica.DefaultShardTable}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		return -1, nil
	case err != nil:
		return 0, fmt.Errorf("reading the shard table: %w", err)
	}
	return len(cm.Data), nil
}

// deleteShardTable deletes the labeler's shard table, so that the next
// fleet starts on a cold one.
func (b *bench) deleteShardTable(ctx context.Context) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: replica.DefaultShardTable}}
	if err := b.c.Delete(ctx, cm); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the shard table: %w", err)
	}
	return nil
}
