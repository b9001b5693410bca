// Package custommetrics serves the Pods metric kshard_objects_held of the
// Kubernetes custom metrics API (custom.metrics.k8s.io) without Prometheus:
// the objects each kshard replica holds, the sum of its per-shard gauge
// kshard_shard_objects, read by scraping every replica's metrics endpoint.
// The HPA of deploy/autoscaling scales the StatefulSet on it; with
// Prometheus, prometheus-adapter serves the same metric from the same sum.
//
// A Provider scrapes on a period into an in-memory snapshot and answers
// queries from the last snapshot, so a query never waits on a scrape. It
// implements provider.CustomMetricsProvider of
// sigs.k8s.io/custom-metrics-apiserver; the API server around it is
// cmd/kshard-metrics-adapter, so this package is tested without it.
package custommetrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/transport"
	"k8s.io/klog/v2"
	"k8s.io/metrics/pkg/apis/custom_metrics"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/kshard/kshard/internal/promtext"
)

// podsResource is the only resource the metric describes.
var podsResource = schema.GroupResource{Resource: "pods"}

// Provider answers custom metrics API queries for the replicas' objects held.
// Create it with New, run its scrapes with Run, and hand it to the custom
// metrics API server (cmd.AdapterBase.WithCustomMetrics).
type Provider struct {
	opts      Options
	factory   informers.SharedInformerFactory
	pods      corelisters.PodLister
	podsSync  func() bool
	client    *http.Client
	snap      atomic.Pointer[snapshot]
	failing   map[types.NamespacedName]bool // touched by Run's goroutine only
	scrapes   *prometheus.CounterVec
	podsGauge prometheus.Gauge
}

var _ provider.CustomMetricsProvider = (*Provider)(nil)

// New makes a Provider that watches the replica pods through client. It
// starts nothing: Run does.
func New(ctx context.Context, client kubernetes.Interface, opts Options) (*Provider, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, fmt.Errorf("custom metrics options: %w", err)
	}
	log := klog.FromContext(ctx)
	p := &Provider{opts: opts, failing: map[types.NamespacedName]bool{}}
	insecure := opts.insecure(log)

	tc := &transport.Config{
		UserAgent: "kshard-metrics-adapter",
		TLS:       transport.TLSConfig{CAFile: opts.CAFile, ServerName: opts.ServerName, Insecure: insecure},
	}
	if opts.TokenFile != "-" {
		tc.BearerTokenFile = opts.TokenFile
	}
	if insecure {
		// client-go refuses a CA together with Insecure.
		tc.TLS.CAFile = ""
	}
	rt, err := transport.New(tc)
	if err != nil {
		return nil, fmt.Errorf("scrape transport: %w", err)
	}
	p.client = &http.Client{Transport: rt, Timeout: opts.Timeout}

	sel := opts.Selector.String()
	p.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(opts.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = sel }))
	podInformer := p.factory.Core().V1().Pods()
	p.podsSync = podInformer.Informer().HasSynced
	p.pods = podInformer.Lister()

	p.scrapes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_metrics_adapter_scrapes_total",
		Help: "Scrapes of kshard replicas by the metrics adapter, by result (success, failure).",
	}, []string{"result"})
	p.podsGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kshard_metrics_adapter_pods",
		Help: "Replica pods in the adapter's last completed scrape round, the ones it serves metrics for.",
	})
	if opts.Registerer != nil {
		if err := errors.Join(opts.Registerer.Register(p.scrapes), opts.Registerer.Register(p.podsGauge)); err != nil {
			return nil, fmt.Errorf("registering the adapter's metrics: %w", err)
		}
	}
	return p, nil
}

// Run watches the replica pods and scrapes them every period until ctx is
// done; the first round starts once the pods are listed (until then, the
// pod informer logs why it cannot list them, e.g. missing RBAC).
func (p *Provider) Run(ctx context.Context) error {
	log := klog.FromContext(ctx).WithValues("namespace", p.opts.Namespace, "selector", p.opts.Selector.String())
	ctx = klog.NewContext(ctx, log)
	p.factory.Start(ctx.Done())
	defer p.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), p.podsSync) {
		return nil // stopped before the pods were listed
	}
	log.Info("scraping replicas", "period", p.opts.Period, "metric", p.opts.Metric, "source", p.opts.SourceMetric)
	wait.UntilWithContext(ctx, p.round, p.opts.Period)
	return nil
}

// HasSynced says whether a scrape round has completed, so queries have an
// answer: the adapter's readiness.
func (p *Provider) HasSynced() bool { return p.snap.Load() != nil }

// round scrapes every selected replica once and publishes the snapshot.
func (p *Provider) round(ctx context.Context) {
	log := klog.FromContext(ctx)
	pods, err := p.pods.List(p.opts.Selector)
	if err != nil {
		log.Error(err, "listing replica pods from the cache")
		return
	}
	type result struct {
		key    types.NamespacedName
		sample podSample
		err    error
	}
	results := make([]result, len(pods))
	var g errgroup.Group
	g.SetLimit(p.opts.Concurrency)
	for i, pod := range pods {
		g.Go(func() error {
			s, err := p.scrapePod(ctx, pod)
			results[i] = result{key: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, sample: s, err: err}
			return nil
		})
	}
	_ = g.Wait() // every scrape returns nil: its error is in its result
	if ctx.Err() != nil {
		return // stopping: the cancelled scrapes are no failures of the replicas
	}

	next := &snapshot{pods: make(map[types.NamespacedName]podSample, len(pods))}
	failing := make(map[types.NamespacedName]bool)
	for _, r := range results {
		if r.err != nil {
			p.scrapes.WithLabelValues("failure").Inc()
			failing[r.key] = true
			// Logged when a pod starts failing; every failure at V(2), so a
			// crash-looping replica does not fill the log.
			if !p.failing[r.key] {
				log.Error(r.err, "scraping replica failed; it is absent from the metric until a scrape succeeds", "pod", r.key)
			} else {
				log.V(2).Info("scraping replica failed again", "pod", r.key, "err", r.err.Error())
			}
			continue
		}
		p.scrapes.WithLabelValues("success").Inc()
		if p.failing[r.key] {
			log.Info("scraping replica succeeds again", "pod", r.key)
		}
		next.pods[r.key] = r.sample
	}
	p.failing = failing
	p.podsGauge.Set(float64(len(next.pods)))
	p.snap.Store(next)
	log.V(1).Info("scrape round done", "pods", len(pods), "scraped", len(next.pods))
}

// scrapePod reads one replica's source metric.
func (p *Provider) scrapePod(ctx context.Context, pod *corev1.Pod) (podSample, error) {
	u, err := p.opts.URL(pod)
	if err != nil {
		return podSample{}, fmt.Errorf("address of pod %s: %w", pod.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return podSample{}, fmt.Errorf("scraping %s: %w", u, err)
	}
	// The text format: promtext reads it, and controller-runtime serves it
	// when asked.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := p.client.Do(req)
	if err != nil {
		return podSample{}, fmt.Errorf("scraping: %w", err) // names the URL
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return podSample{}, fmt.Errorf("scraping %s: %s: %q", u, resp.Status, body)
	}
	families, err := promtext.Parse(io.LimitReader(resp.Body, maxScrapeBytes))
	if err != nil {
		return podSample{}, fmt.Errorf("scraping %s: %w", u, err)
	}
	return podSample{
		labels: labels.Set(pod.Labels),
		series: seriesOf(families[p.opts.SourceMetric]),
		at:     time.Now(),
	}, nil
}

// GetMetricByName answers for one replica pod: its objects held in the last
// round, or NotFound when it was not scraped successfully.
func (p *Provider) GetMetricByName(_ context.Context, name types.NamespacedName, info provider.CustomMetricInfo, metricSelector labels.Selector) (*custom_metrics.MetricValue, error) {
	if err := p.check(info); err != nil {
		return nil, err
	}
	snap, err := p.snapshot()
	if err != nil {
		return nil, err
	}
	s, ok := snap.pods[name]
	if !ok {
		return nil, provider.NewMetricNotFoundForError(info.GroupResource, info.Metric, name.Name)
	}
	v := p.value(name, s, metricSelector)
	return &v, nil
}

// GetMetricBySelector answers for the replica pods of namespace that
// selector matches (the HPA passes its target's pod selector) and that
// answered the last round; a pod whose scrape failed is left out, and the
// HPA treats it as it treats a pod with no metric.
func (p *Provider) GetMetricBySelector(_ context.Context, namespace string, selector labels.Selector, info provider.CustomMetricInfo, metricSelector labels.Selector) (*custom_metrics.MetricValueList, error) {
	if err := p.check(info); err != nil {
		return nil, err
	}
	snap, err := p.snapshot()
	if err != nil {
		return nil, err
	}
	list := &custom_metrics.MetricValueList{Items: []custom_metrics.MetricValue{}}
	for _, key := range snap.matching(namespace, selector) {
		list.Items = append(list.Items, p.value(key, snap.pods[key], metricSelector))
	}
	return list, nil
}

// ListAllMetrics names the one metric served, for discovery.
func (p *Provider) ListAllMetrics() []provider.CustomMetricInfo {
	return []provider.CustomMetricInfo{{GroupResource: podsResource, Namespaced: true, Metric: p.opts.Metric}}
}

// check refuses every metric but ours.
func (p *Provider) check(info provider.CustomMetricInfo) error {
	if (info.GroupResource != podsResource && info.GroupResource != schema.GroupResource{Resource: "pod"}) || info.Metric != p.opts.Metric {
		return provider.NewMetricNotFoundError(info.GroupResource, info.Metric)
	}
	return nil
}

func (p *Provider) snapshot() (*snapshot, error) {
	snap := p.snap.Load()
	if snap == nil {
		return nil, apierrors.NewServiceUnavailable("no scrape of the kshard replicas has completed yet")
	}
	return snap, nil
}

// value is one pod's answer.
func (p *Provider) value(key types.NamespacedName, s podSample, metricSelector labels.Selector) custom_metrics.MetricValue {
	v := custom_metrics.MetricValue{
		DescribedObject: custom_metrics.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: key.Namespace, Name: key.Name},
		Metric:          custom_metrics.MetricIdentifier{Name: p.opts.Metric},
		Timestamp:       metav1.NewTime(s.at),
		Value:           quantity(s.sum(metricSelector)),
	}
	if !metricSelector.Empty() {
		if sel, err := metav1.ParseToLabelSelector(metricSelector.String()); err == nil {
			v.Metric.Selector = sel
		}
	}
	return v
}
