package replica

import (
	"net/http"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
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
