// Command kshard-metrics-adapter serves the Pods metric kshard_objects_held
// of the custom metrics API (custom.metrics.k8s.io/v1beta2), so the HPA of
// deploy/autoscaling can scale the kshard StatefulSet in a cluster without
// Prometheus and prometheus-adapter: it scrapes every replica's metrics on a
// period and sums each one's per-shard objects gauge (package
// cmd/kshard-metrics-adapter/internal/custommetrics). It is an aggregated API server
// (sigs.k8s.io/custom-metrics-apiserver), deployed by deploy/metrics-adapter.
//
// It is a binary of its own, not a `kshard` subcommand, so that the replica
// binary does not link k8s.io/apiserver.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/logs"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/apiserver/metrics"
	basecmd "sigs.k8s.io/custom-metrics-apiserver/pkg/cmd"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"

	"github.com/kshard/kshard/cmd/kshard-metrics-adapter/internal/custommetrics"
)

// defaultSecurePort is the adapter's HTTPS port: above 1024, so that it
// runs as a non-root user without capabilities (the library's default is
// 443).
const defaultSecurePort = 6443

func main() {
	logs.InitLogs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, pflag.ErrHelp) {
		klog.ErrorS(err, "kshard-metrics-adapter failed")
		logs.FlushLogs()
		os.Exit(1)
	}
	logs.FlushLogs()
}

// adapter is the custom metrics API server with kshard's provider.
type adapter struct {
	basecmd.AdapterBase
	opts      custommetrics.Options
	selector  string
	tlsVerify string
}

// newAdapter binds the library's flags (serving, delegated authentication
// and authorization, --lister-kubeconfig) and the provider's to a flag set.
func newAdapter() *adapter {
	a := &adapter{}
	a.Name = "kshard-metrics-adapter"
	a.FlagSet = pflag.NewFlagSet(a.Name, pflag.ContinueOnError)
	a.CustomMetricsAdapterServerOptions = options.NewCustomMetricsAdapterServerOptions()
	a.SecureServing.BindPort = defaultSecurePort
	// Without --tls-cert-file the self-signed serving certificate stays in
	// memory: the root file system is read-only.
	a.SecureServing.ServerCert.CertDirectory = ""
	a.InstallFlags()

	fs := a.FlagSet
	o := &a.opts
	fs.StringVar(&o.Namespace, "namespace", custommetrics.DefaultNamespace,
		"namespace of the kshard replica pods; the adapter watches pods only there")
	fs.StringVar(&a.selector, "pod-selector", custommetrics.DefaultPodSelector,
		"label selector of the replica pods in --namespace")
	fs.StringVar(&o.Metric, "metric", custommetrics.DefaultMetric,
		"name of the Pods metric served: the one the HPA asks for")
	fs.StringVar(&o.SourceMetric, "source-metric", custommetrics.DefaultSourceMetric,
		"the replicas' per-shard gauge, summed per pod")
	fs.DurationVar(&o.Period, "scrape-period", custommetrics.DefaultPeriod,
		"time between two scrapes of every replica; queries are answered from the last round")
	fs.DurationVar(&o.Timeout, "scrape-timeout", custommetrics.DefaultTimeout,
		"bound of one scrape, at most --scrape-period; a replica that does not answer is absent from the round")
	fs.IntVar(&o.Concurrency, "scrape-concurrency", custommetrics.DefaultConcurrency,
		"replicas scraped at once")
	fs.IntVar(&o.Port, "scrape-port", custommetrics.DefaultPort,
		"the replicas' metrics port (the base's --metrics-bind-address=:8443): scrapes go to https://<pod IP>:<port><path>")
	fs.StringVar(&o.Path, "scrape-path", custommetrics.DefaultPath, "the replicas' metrics path")
	fs.StringVar(&o.TokenFile, "scrape-token-file", custommetrics.DefaultTokenFile,
		"bearer token sent to the replicas, re-read as it rotates (the pod's ServiceAccount token; \"-\" for none); "+
			"the ServiceAccount needs get on the nonResourceURL /metrics")
	fs.StringVar(&a.tlsVerify, "scrape-tls-verify", string(custommetrics.DefaultTLSVerify),
		"verify the replicas' serving certificates: auto (verify against --scrape-ca-file when given, "+
			"else skip verification with a warning: the replicas' default certificate is self-signed), "+
			"verify (against --scrape-ca-file, else the system roots), or skip")
	fs.StringVar(&o.CAFile, "scrape-ca-file", "",
		"PEM CA bundle of the replicas' serving certificates (deploy/metrics-cert: ca.crt of Secret kshard-metrics-cert)")
	fs.StringVar(&o.ServerName, "scrape-server-name", "",
		"name verified in the replicas' certificates, which are not issued for pod IPs "+
			"(deploy/metrics-cert: kshard-metrics.kshard-system.svc); default the pod IP")
	logs.AddFlags(fs)
	return a
}

// run parses args and serves until ctx is done.
func run(ctx context.Context, args []string) error {
	a := newAdapter()
	if err := a.FlagSet.Parse(args); err != nil {
		return err
	}
	ctx = klog.NewContext(ctx, klog.Background().WithName("kshard-metrics-adapter"))

	sel, err := labels.Parse(a.selector)
	if err != nil {
		return fmt.Errorf("--pod-selector: %w", err)
	}
	a.opts.Selector = sel
	a.opts.TLSVerify = custommetrics.TLSVerification(a.tlsVerify)
	a.opts.Registerer = legacyregistry.Registerer()

	cfg, err := a.ClientConfig()
	if err != nil {
		return fmt.Errorf("client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	p, err := custommetrics.New(ctx, client, a.opts)
	if err != nil {
		return err
	}
	a.WithCustomMetrics(p)
	if err := metrics.RegisterMetrics(legacyregistry.Register); err != nil {
		return fmt.Errorf("registering the API server's metrics: %w", err)
	}
	server, err := a.Server()
	if err != nil {
		return fmt.Errorf("custom metrics API server: %w", err)
	}
	// Ready once the replicas were scraped, so that the Service sends the
	// HPA's first query to an adapter that has an answer.
	err = server.GenericAPIServer.AddReadyzChecks(healthz.NamedCheck("kshard-replicas-scraped", func(*http.Request) error {
		if !p.HasSynced() {
			return errors.New("no scrape round of the replicas has completed yet")
		}
		return nil
	}))
	if err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.Run(ctx) })
	g.Go(func() error {
		if err := a.Run(ctx); err != nil {
			return fmt.Errorf("serving the custom metrics API: %w", err)
		}
		return nil
	})
	return g.Wait()
}
