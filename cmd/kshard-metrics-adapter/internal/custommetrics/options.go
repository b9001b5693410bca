package custommetrics

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Defaults of Options: what deploy/base and deploy/metrics-adapter deploy.
const (
	// DefaultNamespace is deploy/base's namespace.
	DefaultNamespace = "kshard-system"
	// DefaultPodSelector is the label of deploy/base's replica pods (the
	// StatefulSet's selector).
	DefaultPodSelector = "app.kubernetes.io/name=kshard"
	// DefaultMetric is the metric deploy/autoscaling's HPA asks for.
	DefaultMetric = "kshard_objects_held"
	// DefaultSourceMetric is the sharding package's per-shard gauge.
	DefaultSourceMetric = "kshard_shard_objects"
	// DefaultPeriod matches the HPA controller's default sync period, so
	// each HPA decision sees a round at most one period old.
	DefaultPeriod = 15 * time.Second
	// DefaultTimeout leaves a slow replica a third of the period.
	DefaultTimeout = 5 * time.Second
	// DefaultConcurrency scrapes a ring of up to 8 replicas at once (the
	// HPA's bound is 10).
	DefaultConcurrency = 8
	// DefaultPort is deploy/base's --metrics-bind-address=:8443.
	DefaultPort = 8443
	// DefaultPath is controller-runtime's metrics path.
	DefaultPath = "/metrics"
	// DefaultTokenFile is where the kubelet mounts the pod's
	// ServiceAccount token.
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	// DefaultTLSVerify verifies when a CA is given.
	DefaultTLSVerify = TLSVerifyAuto
)

// maxScrapeBytes bounds what is read of one scrape: a replica's metrics are
// a few hundred KiB.
const maxScrapeBytes int64 = 32 << 20

// TLSVerification says whether scrapes check the replicas' serving
// certificates. The replicas' metrics endpoint has a self-signed certificate
// unless deploy/metrics-cert gives them one from a CA, so verification is a
// choice the deployment states.
type TLSVerification string

const (
	// TLSVerifyAuto verifies against Options.CAFile when one is given, and
	// skips verification otherwise, with a warning logged at start.
	TLSVerifyAuto TLSVerification = "auto"
	// TLSVerify always verifies: against Options.CAFile, or the system's
	// roots without one.
	TLSVerify TLSVerification = "verify"
	// TLSSkipVerify never verifies. The bearer token is still sent: whoever
	// answers on a replica's address can read it.
	TLSSkipVerify TLSVerification = "skip"
)

// Options configure a Provider. The zero value of each field takes the
// default its comment names.
type Options struct {
	// Namespace holds the replica pods; the adapter watches pods only there
	// (its RBAC is a Role in that namespace) and answers queries for other
	// namespaces with no pods. Default DefaultNamespace.
	Namespace string

	// Selector picks the replica pods among the namespace's pods. Default
	// DefaultPodSelector, the base StatefulSet's pod label.
	Selector labels.Selector

	// Metric is the name of the Pods metric served, which the HPA asks
	// for. Default DefaultMetric.
	Metric string

	// SourceMetric is the replicas' gauge family whose series are summed
	// per pod: one series per held shard. Default DefaultSourceMetric.
	SourceMetric string

	// Period is the time between two scrapes of every replica. Queries are
	// answered from the last completed round, never by scraping, so an HPA
	// query never waits on N scrapes. Default DefaultPeriod.
	Period time.Duration

	// Timeout bounds one scrape; a replica that does not answer in time is
	// absent from the round. Default DefaultTimeout; at most Period.
	Timeout time.Duration

	// Concurrency is the number of replicas scraped at once. Default
	// DefaultConcurrency.
	Concurrency int

	// Port is the replicas' metrics port, in the default URL
	// https://<pod IP>:<Port><Path>. Default DefaultPort.
	Port int
	// Path is the replicas' metrics path, in the default URL. Default
	// DefaultPath.
	Path string

	// URL maps a replica pod to the address of its metrics. Default
	// https://<pod IP>:<Port><Path>; a pod without an IP yet is an error,
	// and so absent from the round. Set it where pod IPs are not
	// reachable, or to scrape through a proxy.
	URL func(pod *corev1.Pod) (string, error)

	// TokenFile holds the bearer token sent with each scrape: the replicas'
	// metrics filter authenticates it with a TokenReview and authorizes
	// "get" on the nonResourceURL /metrics. It is re-read as the kubelet
	// rotates it. Default DefaultTokenFile, the pod's ServiceAccount token;
	// "-" sends no token.
	TokenFile string

	// TLSVerify says whether scrapes verify the replicas' certificates.
	// Default DefaultTLSVerify (auto).
	TLSVerify TLSVerification

	// CAFile is the PEM bundle that signs the replicas' serving
	// certificates (deploy/metrics-cert: ca.crt of Secret
	// kshard-metrics-cert). Default none.
	CAFile string

	// ServerName is the name verified in the replicas' certificates, which
	// are not issued for pod IPs (deploy/metrics-cert:
	// kshard-metrics.kshard-system.svc). Default the URL's host.
	ServerName string

	// Registerer receives the adapter's own metrics (scrapes, failures,
	// pods in the last round). Default none: not registered.
	Registerer prometheus.Registerer
}

// setDefaults fills the zero fields and checks the others.
func (o *Options) setDefaults() error {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if o.Selector == nil {
		sel, err := labels.Parse(DefaultPodSelector)
		if err != nil {
			return fmt.Errorf("default pod selector: %w", err)
		}
		o.Selector = sel
	}
	if o.Metric == "" {
		o.Metric = DefaultMetric
	}
	if o.SourceMetric == "" {
		o.SourceMetric = DefaultSourceMetric
	}
	if o.Period == 0 {
		o.Period = DefaultPeriod
	}
	if o.Timeout == 0 {
		o.Timeout = min(DefaultTimeout, o.Period)
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Path == "" {
		o.Path = DefaultPath
	}
	if o.URL == nil {
		port, path := o.Port, o.Path
		o.URL = func(pod *corev1.Pod) (string, error) { return podURL(pod, port, path) }
	}
	if o.TokenFile == "" {
		o.TokenFile = DefaultTokenFile
	}
	if o.TLSVerify == "" {
		o.TLSVerify = DefaultTLSVerify
	}
	switch {
	case o.Period < 0 || o.Timeout < 0 || o.Concurrency < 0:
		return fmt.Errorf("period %s, timeout %s and concurrency %d must be positive", o.Period, o.Timeout, o.Concurrency)
	case o.Timeout > o.Period:
		return fmt.Errorf("scrape timeout %s exceeds the period %s: rounds would overlap", o.Timeout, o.Period)
	case o.Port < 1 || o.Port > 65535:
		return fmt.Errorf("port %d out of range", o.Port)
	}
	switch o.TLSVerify {
	case TLSVerifyAuto, TLSVerify, TLSSkipVerify:
	default:
		return fmt.Errorf("TLS verification %q: want %s, %s or %s", o.TLSVerify, TLSVerifyAuto, TLSVerify, TLSSkipVerify)
	}
	return nil
}

// insecure resolves TLSVerify: whether scrapes skip verification.
func (o *Options) insecure(log logr.Logger) bool {
	switch {
	case o.TLSVerify == TLSSkipVerify:
		log.Info("scrapes do not verify the replicas' certificates (TLS verification skip): give the CA that signs them to verify")
		return true
	case o.TLSVerify == TLSVerifyAuto && o.CAFile == "":
		log.Info("WARNING: no CA file for the replicas' certificates, so scrapes do not verify them (TLS verification auto); " +
			"the replicas' default certificate is self-signed: use deploy/metrics-cert and --scrape-ca-file to verify")
		return true
	}
	return false
}

// podURL is the default Options.URL.
func podURL(pod *corev1.Pod, port int, path string) (string, error) {
	if pod.Status.PodIP == "" {
		return "", errors.New("the pod has no IP yet")
	}
	u := url.URL{Scheme: "https", Host: net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port)), Path: path}
	return u.String(), nil
}
