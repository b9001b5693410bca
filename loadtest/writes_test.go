package loadtest

import (
	"net/http"
	"sync/atomic"
	"testing"
)

func TestResourceOfPath(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/namespaces/loadtest/configmaps/cb-1-config":                              "configmaps",
		"/api/v1/namespaces/loadtest/configmaps":                                          "configmaps",
		"/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings/cb-1/status": "configbindings",
		"/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings":             "configbindings",
		"/api/v1/namespaces/loadtest":                                                     "namespaces",
		"/apis/apps/v1/namespaces/kshard-loadtest/statefulsets/kshard":                    "statefulsets",
		"/apis/coordination.k8s.io/v1/namespaces/kshard-loadtest/leases/shard-1":          "leases",
		"/k8s/clusters/c-1/apis/config.kshard.dev/v1alpha1/namespaces/x/configbindings/y": "configbindings",
		"/apis/config.kshard.dev/v1alpha1/externaldomains/domain-1":                       "externaldomains",
		"/metrics": "",
		"/api/v1":  "",
	} {
		if got := resourceOfPath(path); got != want {
			t.Errorf("resourceOfPath(%q) = %q, want %q", path, got, want)
		}
	}
}

type nopTransport struct{}

func (nopTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
}

func TestWriteCounter(t *testing.T) {
	var n atomic.Int64
	c := &http.Client{Transport: &writeCounter{next: nopTransport{}, n: &n}}
	const base = "http://127.0.0.1:6443"
	for _, r := range []struct{ method, path string }{
		{http.MethodPatch, "/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings/cb-1"},      // counted
		{http.MethodPost, "/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings"},            // counted
		{http.MethodDelete, "/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings/cb-2"},     // counted
		{http.MethodPatch, "/api/v1/namespaces/loadtest/configmaps/cb-1-config"},                            // counted
		{http.MethodGet, "/apis/config.kshard.dev/v1alpha1/namespaces/loadtest/configbindings?watch=true"},  // a read
		{http.MethodGet, "/api/v1/namespaces/loadtest/configmaps"},                                          // a read
		{http.MethodPut, "/apis/apps/v1/namespaces/kshard-loadtest/statefulsets/kshard"},                    // not an object
		{http.MethodPost, "/api/v1/namespaces"},                                                             // not an object
		{http.MethodPatch, "/apis/coordination.k8s.io/v1/namespaces/kshard-loadtest/leases/kshard-shard-1"}, // not an object
	} {
		req, err := http.NewRequest(r.method, base+r.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := n.Load(); got != 4 {
		t.Errorf("counted %d object writes, want 4", got)
	}
}
