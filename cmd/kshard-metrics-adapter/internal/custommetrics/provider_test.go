package custommetrics_test

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/kshard/kshard/cmd/kshard-metrics-adapter/internal/custommetrics"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/promtext"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { os.Exit(controlplane.RunTests(m, &cp)) }

const token = "scrape-token-of-the-test"

// replica is a fake replica's metrics endpoint: a real loopback HTTPS
// server that records the Authorization headers it got.
type replica struct {
	srv  *httptest.Server
	mu   sync.Mutex
	auth []string
}

func newReplica(t *testing.T, status int, body string) *replica {
	t.Helper()
	r := &replica{}
	r.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.auth = append(r.auth, req.Header.Get("Authorization"))
		r.mu.Unlock()
		if req.URL.Path != "/metrics" {
			http.NotFound(w, req)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *replica) headers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.auth...)
}

func shardObjects(values map[string]float64) string {
	s := "# TYPE kshard_shard_objects gauge\n"
	for shard, v := range values {
		s += fmt.Sprintf("kshard_shard_objects{ring=\"kshard\",shard=%q} %v\n", shard, v)
	}
	return s + "# TYPE kshard_shards_owned gauge\nkshard_shards_owned{ring=\"kshard\"} " + fmt.Sprint(len(values)) + "\n"
}

// fixture is a namespace of pods in the real API server, each served by a
// replica: pods have no reachable IP here, so Options.URL maps each to its
// server.
type fixture struct {
	ns       string
	replicas map[string]*replica
	urls     map[string]string
	registry *prometheus.Registry
}

var replicaLabels = map[string]string{"app.kubernetes.io/name": "kshard"}

func newFixture(ctx context.Context, t *testing.T, cs kubernetes.Interface, pods map[string]*replica, podLabels map[string]map[string]string) *fixture {
	t.Helper()
	f := &fixture{ns: "metrics-" + utilrand.String(6), replicas: pods, urls: map[string]string{}, registry: prometheus.NewRegistry()}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), f.ns, metav1.DeleteOptions{}) })
	for name, r := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns, Labels: podLabels[name]},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "kshard", Image: "kshard:test"}}},
		}
		if _, err := cs.CoreV1().Pods(f.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.urls[name] = r.srv.URL + "/metrics"
	}
	return f
}

func (f *fixture) url(pod *corev1.Pod) (string, error) {
	u, ok := f.urls[pod.Name]
	if !ok {
		return "", errors.New("no server for this pod")
	}
	return u, nil
}

// start runs a provider until the test ends and waits for its first round.
// The period is long: every assertion reads the first round.
func (f *fixture) start(ctx context.Context, t *testing.T, cs kubernetes.Interface, opts custommetrics.Options) *custommetrics.Provider {
	t.Helper()
	opts.Namespace = f.ns
	opts.URL = f.url
	opts.Period = time.Hour
	opts.Timeout = time.Minute
	opts.Registerer = f.registry
	p, err := custommetrics.New(ctx, cs, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	controlplane.Eventually(t, time.Minute, "first scrape round", func() error {
		if !p.HasSynced() {
			return errors.New("no round completed")
		}
		return nil
	})
	return p
}

// scrapes reads the provider's scrape counter by result.
func (f *fixture) scrapes(t *testing.T) map[string]float64 {
	t.Helper()
	fams, err := f.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, fam := range fams {
		if fam.GetName() != "kshard_metrics_adapter_scrapes_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			out[promtext.Label(m, "result")] += promtext.Value(m)
		}
	}
	return out
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// caFile is the PEM of the httptest servers' certificate, which every
// httptest server shares: the CA that verifies them.
func caFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	return writeFile(t, "ca.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
}

var objectsHeld = provider.CustomMetricInfo{GroupResource: schema.GroupResource{Resource: "pods"}, Namespaced: true, Metric: "kshard_objects_held"}

// TestProviderScrapesReplicas runs the provider against pods in a real API
// server and replicas on real loopback HTTPS servers, verified against
// their CA: each selected pod's value is the sum of its per-shard gauge, a
// replica whose scrape fails is absent (and counted) while the others
// answer, a pod the selector does not pick is never scraped, and every
// scrape carries the token from the token file.
func TestProviderScrapesReplicas(t *testing.T) {
	controlplane.Require(t, cp)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	replicas := map[string]*replica{
		"kshard-0": newReplica(t, http.StatusOK, shardObjects(map[string]float64{"3": 1200, "17": 3800})),
		"kshard-1": newReplica(t, http.StatusOK, shardObjects(nil)),
		"kshard-2": newReplica(t, http.StatusInternalServerError, "broken\n"),
		"other-0":  newReplica(t, http.StatusOK, shardObjects(map[string]float64{"1": 9})),
	}
	podLabels := map[string]map[string]string{
		"kshard-0": replicaLabels, "kshard-1": replicaLabels, "kshard-2": replicaLabels,
		"other-0": {"app.kubernetes.io/name": "other"},
	}
	f := newFixture(ctx, t, cs, replicas, podLabels)
	p := f.start(ctx, t, cs, custommetrics.Options{
		TokenFile: writeFile(t, "token", []byte(token+"\n")),
		TLSVerify: custommetrics.TLSVerify,
		CAFile:    caFile(t, replicas["kshard-0"].srv),
	})

	// What the HPA asks: the pods of its StatefulSet's selector.
	sel := labels.SelectorFromSet(replicaLabels)
	list, err := p.GetMetricBySelector(ctx, f.ns, sel, objectsHeld, labels.Everything())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, v := range list.Items {
		got[v.DescribedObject.Name] = v.Value.String()
		if v.DescribedObject.Namespace != f.ns || v.Timestamp.IsZero() {
			t.Errorf("value %+v", v)
		}
	}
	if len(got) != 2 || got["kshard-0"] != "5k" || got["kshard-1"] != "0" {
		t.Errorf("values %v, want kshard-0 5k and kshard-1 0, and not the failing kshard-2", got)
	}

	v, err := p.GetMetricByName(ctx, types.NamespacedName{Namespace: f.ns, Name: "kshard-0"}, objectsHeld, labels.Everything())
	if err != nil || v.Value.String() != "5k" {
		t.Errorf("kshard-0: %v, %v; want 5k", v, err)
	}
	if _, err := p.GetMetricByName(ctx, types.NamespacedName{Namespace: f.ns, Name: "kshard-2"}, objectsHeld, labels.Everything()); !apierrors.IsNotFound(err) {
		t.Errorf("kshard-2, whose scrape failed: got %v, want NotFound", err)
	}
	if list, err := p.GetMetricBySelector(ctx, "elsewhere", labels.Everything(), objectsHeld, labels.Everything()); err != nil || len(list.Items) != 0 {
		t.Errorf("another namespace: %v, %v; want no pods", list, err)
	}

	if n := f.scrapes(t); n["failure"] < 1 || n["success"] < 2 {
		t.Errorf("scrapes by result %v: want kshard-2's failure counted and two successes", n)
	}
	if h := replicas["other-0"].headers(); len(h) != 0 {
		t.Errorf("a pod the selector does not pick was scraped %d times", len(h))
	}
	for _, name := range []string{"kshard-0", "kshard-1", "kshard-2"} {
		h := replicas[name].headers()
		if len(h) == 0 {
			t.Errorf("%s was never scraped", name)
		}
		for _, a := range h {
			if a != "Bearer "+token {
				t.Errorf("%s got Authorization %q, want the token file's bearer token", name, a)
			}
		}
	}
}

// TestProviderVerifiesCertificates: told to verify, without the CA that
// signed the replicas' certificates, the provider scrapes nothing (every
// replica absent); told to skip verification, it reads them.
func TestProviderVerifiesCertificates(t *testing.T) {
	controlplane.Require(t, cp)
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		verify custommetrics.TLSVerification
		want   int
	}{{custommetrics.TLSVerify, 0}, {custommetrics.TLSSkipVerify, 1}} {
		t.Run(string(tc.verify), func(t *testing.T) {
			r := newReplica(t, http.StatusOK, shardObjects(map[string]float64{"0": 1}))
			f := newFixture(ctx, t, cs, map[string]*replica{"kshard-0": r}, map[string]map[string]string{"kshard-0": replicaLabels})
			p := f.start(ctx, t, cs, custommetrics.Options{TokenFile: "-", TLSVerify: tc.verify})
			list, err := p.GetMetricBySelector(ctx, f.ns, labels.Everything(), objectsHeld, labels.Everything())
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != tc.want {
				t.Errorf("%d pods answered, want %d", len(list.Items), tc.want)
			}
			if tc.want == 0 && f.scrapes(t)["failure"] < 1 {
				t.Error("the refused certificate was not counted as a failed scrape")
			}
			for _, a := range r.headers() {
				if a != "" {
					t.Errorf("sent Authorization %q with --scrape-token-file=-", a)
				}
			}
		})
	}
}
