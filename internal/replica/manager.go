package replica

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
)

// filterProvider protects metrics served over HTTPS with the API server's
// TokenReview and SubjectAccessReview, as in a cluster; plain HTTP (local
// runs on loopback) has no filter.
func filterProvider(secure bool) func(*rest.Config, *http.Client) (metricsserver.Filter, error) {
	if !secure {
		return nil
	}
	return filters.WithAuthenticationAndAuthorization
}

// controllerConfig lets several replicas live in one process (tests): the
// controller names repeat.
func controllerConfig() config.Controller {
	return config.Controller{SkipNameValidation: ptr.To(true)}
}

// webhookServer serves the admission pre-check when a port is set; with
// none it is never started (nothing registers on it).
func webhookServer(opts Options) webhook.Server {
	return webhook.NewServer(webhook.Options{Host: opts.WebhookHost, Port: opts.WebhookPort, CertDir: opts.WebhookCertDir,
		TLSOpts: tlsOpts(opts.EnableHTTP2)})
}

// tlsOpts turns HTTP/2 off on the webhook and metrics servers unless asked
// for: its stream handling had denial-of-service flaws (HTTP/2 Rapid Reset,
// CVE-2023-44487; CVE-2023-39325), and neither server needs it.
func tlsOpts(http2 bool) []func(*tls.Config) {
	if http2 {
		return nil
	}
	return []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
}

// registerWebhook serves the ConfigBinding pre-check, answered from what
// the replica knows locally; the replica is ready once it serves.
func registerWebhook(mgr manager.Manager, adm *configbinding.Admission) error {
	srv := mgr.GetWebhookServer()
	srv.Register(configbinding.WebhookPath,
		admission.WithValidator[*configv1alpha1.ConfigBinding](mgr.GetScheme(), adm))
	return mgr.AddReadyzCheck("webhook", srv.StartedChecker())
}

// newManager creates the replica's manager: metrics and probes, the leader
// election of the single active replica (sharding off), and its cache:
// owned ConfigMaps only, without their data.
func newManager(cfg *rest.Config, opts Options) (manager.Manager, error) {
	shutdown := opts.RenewDeadline + sharding.DefaultDrainTimeout + 10*time.Second
	mgr, err := ctrl.NewManager(cfg, manager.Options{
		Scheme: Scheme(),
		Metrics: metricsserver.Options{
			BindAddress:    opts.MetricsBindAddress,
			SecureServing:  opts.MetricsSecure,
			CertDir:        opts.MetricsCertDir,
			FilterProvider: filterProvider(opts.MetricsSecure),
			TLSOpts:        tlsOpts(opts.EnableHTTP2),
		},
		HealthProbeBindAddress: opts.HealthProbeBindAddress,
		PprofBindAddress:       opts.PprofBindAddress,
		// With sharding, the labeler runs its own election (sharding/); a
		// manager's lost election would end the process and its shards.
		LeaderElection:                !opts.Sharding,
		LeaderElectionNamespace:       opts.LeaseNamespace,
		LeaderElectionID:              "kshard-" + opts.Ring + "-leader",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 ptr.To(opts.LeaseDuration),
		RenewDeadline:                 ptr.To(opts.RenewDeadline),
		RetryPeriod:                   ptr.To(opts.RetryPeriod),
		GracefulShutdownTimeout:       ptr.To(shutdown),
		Cache: cache.Options{
			DefaultNamespaces: namespaces(opts.Namespaces),
			DefaultTransform:  cache.TransformStripManagedFields(),
			SyncPeriod:        ptr.To(opts.SyncPeriod),
			ByObject: map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Label: configbinding.OwnedConfigMaps(), Transform: func(obj any) (any, error) {
				obj, err := cache.TransformStripManagedFields()(obj)
				if err != nil {
					return nil, err
				}
				return configbinding.CacheTransform(obj)
			}}},
		},
		Controller:    controllerConfig(),
		WebhookServer: webhookServer(opts),
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	return mgr, nil
}
