package replica

import (
	"crypto/tls"
	"net/http"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/reconcile/configbinding"
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
func registerWebhook(mgr manager.Manager, keys configbinding.KeyKnowledge) error {
	srv := mgr.GetWebhookServer()
	srv.Register(configbinding.WebhookPath,
		admission.WithValidator[*configv1alpha1.ConfigBinding](mgr.GetScheme(), &configbinding.Admission{Keys: keys}))
	return mgr.AddReadyzCheck("webhook", srv.StartedChecker())
}
