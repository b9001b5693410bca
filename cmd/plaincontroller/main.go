// Command plaincontroller reconciles kshard's ConfigBinding CRD the way a
// controller-runtime controller is written when nobody has thought about
// scale yet: one active replica (leader election), the manager's default
// cache (every ConfigBinding and every ConfigMap of the cluster, unfiltered,
// managed fields and all), and on every reconcile a synchronous call to the
// config center per key (an etcd Get, or an HTTP GET of kshard's stand-in). It imports no kshard package but the API types,
// which are the CRD's schema: no sharding, no external cache, no change feed,
// no predicates, no write avoidance beyond CreateOrUpdate's comparison.
//
// It exists as the floor of the load tester's compare-sharding scenario (the
// column "plain controller-runtime ×1"): every kshard fleet must beat it on
// time to Ready and heap per replica, or kshard's machinery does not pay for
// itself. Its worker count defaults to kshard's (16), so the comparison is one
// of architecture, not of concurrency.
//
// Being plain, it does not follow the config center's change feed: a value
// changed there reaches a ConfigMap at the binding's next reconcile (a spec
// change, an edit of the ConfigMap, or the cache's resync, every 10 hours by
// default).
//
//	go run ./cmd/plaincontroller --kubeconfig bin/dev/kubeconfig --replica-id plain-0 \
//	  --lease-namespace kshard-system --etcd-servers http://127.0.0.1:2379
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
)

// controllerName names the controller in controller-runtime's metrics
// (controller_runtime_reconcile_total{controller=...}, workqueue_depth{name=...}).
// It is what For(&ConfigBinding{}) would pick by itself, and the name the load
// tester scrapes for every fleet, kshard's included.
const controllerName = "configbinding"

// leaderElectionID names the Lease of the single active replica.
const leaderElectionID = "plaincontroller-leader"

// options are the command line.
type options struct {
	kubeconfig      string
	replicaID       string
	leaseNamespace  string
	leaseDuration   time.Duration
	renewDeadline   time.Duration
	retryPeriod     time.Duration
	configCenter    string
	etcdServers     string
	etcdPrefix      string
	centerURL       string
	centerTokenFile string
	centerTimeout   time.Duration
	metricsAddr     string
	probeAddr       string
	pprofAddr       string
	workers         int
	zap             zap.Options
}

// bindFlags defines the flags on fs. Where `kshard controller` has a flag of
// the same meaning, it has the same name and default, so the load tester
// builds both command lines alike; kshard's flags about the ring, shards,
// the StatefulSet and the audit log have no counterpart here.
func bindFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.replicaID, "replica-id", "", "this replica's name, sent to the config center as the caller (default: $POD_NAME, else the hostname)")
	fs.StringVar(&o.leaseNamespace, "lease-namespace", "kshard-system", "namespace of the leader-election Lease "+leaderElectionID)
	fs.DurationVar(&o.leaseDuration, "lease-duration", 15*time.Second, "leader election: how long the Lease stays with a leader that stopped renewing")
	fs.DurationVar(&o.renewDeadline, "renew-deadline", 10*time.Second, "leader election: a leader that cannot renew for this long stops")
	fs.DurationVar(&o.retryPeriod, "retry-period", 5*time.Second, "leader election: how often the Lease is renewed or tried")
	fs.StringVar(&o.configCenter, "config-center", "etcd", "the config center: \"etcd\" (an etcd v3 key space, --etcd-*) or \"http\" (kshard's stand-in protocol, --configcenter-url)")
	fs.StringVar(&o.etcdServers, "etcd-servers", "", "with --config-center=etcd: the etcd members' client URLs, comma-separated")
	fs.StringVar(&o.etcdPrefix, "etcd-prefix", "/kshard/config", "with --config-center=etcd: the key prefix under which a domain's keys are <prefix>/<domain>/<name>")
	fs.StringVar(&o.centerURL, "configcenter-url", "http://127.0.0.1:8080", "with --config-center=http: base URL of the config center")
	fs.StringVar(&o.centerTokenFile, "configcenter-token-file", "", "file holding a bearer token for the config center")
	fs.DurationVar(&o.centerTimeout, "configcenter-timeout", 10*time.Second, "bound of one config-center call")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address of the metrics endpoint (\"0\" disables it)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "", "address of the pprof endpoint (empty disables it), as kshard's")
	fs.IntVar(&o.workers, "max-concurrent-reconciles", 16, "reconcile workers (kshard's default, for a comparison of architecture)")
	o.zap.BindFlags(fs)
}

func main() {
	var o options
	fs := flag.NewFlagSet("plaincontroller", flag.ExitOnError)
	bindFlags(fs, &o)
	_ = fs.Parse(os.Args[1:]) // ExitOnError
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "plaincontroller: unexpected arguments %q\n", fs.Args())
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	if err := run(o); err != nil {
		ctrl.Log.Error(err, "plaincontroller failed")
		os.Exit(1)
	}
}

func run(o options) error {
	if o.workers < 1 {
		return fmt.Errorf("--max-concurrent-reconciles must be at least 1, got %d", o.workers)
	}
	if o.replicaID == "" {
		o.replicaID = os.Getenv("POD_NAME")
	}
	if o.replicaID == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("defaulting --replica-id: %w", err)
		}
		o.replicaID = host
	}
	token := ""
	if o.centerTokenFile != "" {
		b, err := os.ReadFile(o.centerTokenFile)
		if err != nil {
			return fmt.Errorf("reading --configcenter-token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	var center valueReader
	switch o.configCenter {
	case "etcd":
		c, err := newEtcdReader(o.etcdServers, o.etcdPrefix, o.centerTimeout)
		if err != nil {
			return err
		}
		defer c.close()
		center = c
	case "http":
		c, err := newCenterClient(o.centerURL, token, o.replicaID, o.centerTimeout, o.workers)
		if err != nil {
			return err
		}
		center = c
	default:
		return fmt.Errorf("--config-center must be etcd or http, got %q", o.configCenter)
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("building the scheme: %w", err)
	}
	if err := configv1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("building the scheme: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:        o.probeAddr,
		PprofBindAddress:              o.pprofAddr,
		LeaderElection:                true,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       o.leaseNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &o.renewDeadline,
		RetryPeriod:                   &o.retryPeriod,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	err = ctrl.NewControllerManagedBy(mgr).
		For(&configv1alpha1.ConfigBinding{}).
		Owns(&corev1.ConfigMap{}).
		Named(controllerName).
		WithOptions(controller.Options{MaxConcurrentReconciles: o.workers}).
		Complete(&reconciler{Client: mgr.GetClient(), center: center})
	if err != nil {
		return fmt.Errorf("creating the controller: %w", err)
	}
	ctrl.Log.Info("Starting plaincontroller", "replica", o.replicaID, "workers", o.workers, "configCenter", o.configCenter)
	return mgr.Start(ctrl.SetupSignalHandler())
}

// restConfig loads the kubeconfig of --kubeconfig, or by ctrl.GetConfig's
// rules without one. Like ctrl.GetConfig, it turns client-side throttling off
// unless the kubeconfig sets it: the API server's priority and fairness is
// the limit, as for kshard.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("loading the kubeconfig: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("loading --kubeconfig %s: %w", path, err)
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

// newHTTPClient is net/http's default client with a timeout, keeping as many
// idle connections to the config center as there are workers (the default
// keeps 2, and the others would reconnect on every call).
func newHTTPClient(timeout time.Duration, workers int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = max(workers, 2)
	return &http.Client{Transport: t, Timeout: timeout}
}
