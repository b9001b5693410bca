package externaldomain

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	mirrorDomains = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kshard_mirror_domains",
		Help: "Domains whose ExternalDomain mirror this replica keeps current.",
	})
	mirrorWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_mirror_writes_total",
		Help: "Writes of ExternalDomain mirrors to the API server, by result: ok, conflict or error.",
	}, []string{"result"})
	mirrorUnhealthyFeeds = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kshard_mirror_unhealthy_feeds",
		Help: "Mirrored domains whose change feed is unhealthy, so that their keys are fetched again every refresh interval instead.",
	})
	mirrorFetches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kshard_mirror_fetches_total",
		Help: "Calls the mirror made to the config center, by kind (changes, value) and result (ok, error).",
	}, []string{"kind", "result"})
)

func init() {
	metrics.Registry.MustRegister(mirrorDomains, mirrorWrites, mirrorFetches, mirrorUnhealthyFeeds)
}
