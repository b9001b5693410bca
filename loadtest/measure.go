package loadtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// startMeasuring starts what the report's figures come from: the load
// tester's own metrics and the Prometheus that scrapes them with the
// replicas, the API server, its etcd and the config center.
func (r *run) startMeasuring(ctx context.Context, etcdURL string) error {
	var err error
	if r.queries, err = loadQueries("fleets.yaml"); err != nil {
		return err
	}
	dir := filepath.Join(r.work, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating Prometheus's folder: %w", err)
	}
	o := promOptions{binary: r.opts.Prometheus, dir: dir, interval: r.opts.SampleInterval,
		tester: promScrape{addr: r.obs.addr}}
	if o.apiServer, err = apiServerScrape(r.restConfig, r.apiAddr, dir); err != nil {
		return err
	}
	if etcdURL != "" {
		if u, err := url.Parse(etcdURL); err == nil {
			o.etcd = promScrape{addr: u.Host, scheme: u.Scheme}
		}
	}
	if u, err := url.Parse(r.centerURL); err == nil && u.Host != "" {
		o.configCenter = promScrape{addr: u.Host, scheme: u.Scheme}
	}
	if r.pods != nil {
		token := filepath.Join(dir, "replicas.token")
		if err := os.WriteFile(token, []byte(r.pods.metricsToken), 0o600); err != nil {
			return fmt.Errorf("writing the replicas' scrape token: %w", err)
		}
		// The replicas serve a self-signed certificate (deploy/base
		// without deploy/metrics-cert): what is read is counters.
		o.replicas = promScrape{scheme: "https", tokenFile: token, insecure: true}
	}
	r.progress.printf("starting Prometheus ...")
	if r.prom, err = startPrometheus(ctx, r.procs, o); err != nil {
		return err
	}
	r.progress.printf("Prometheus at %s scrapes every %s", r.prom.url, o.interval)
	return nil
}

// apiServerScrape is how Prometheus reads the API server's /metrics: with
// the load tester's own credentials, written into dir.
func apiServerScrape(cfg *rest.Config, addr, dir string) (promScrape, error) {
	s := promScrape{addr: addr, scheme: "https", insecure: cfg.Insecure}
	file := func(name string, data []byte, path string) (string, error) {
		if len(data) == 0 {
			return path, nil
		}
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, data, 0o600)
	}
	var err error
	tls := cfg.TLSClientConfig
	if s.caFile, err = file("apiserver-ca.crt", tls.CAData, tls.CAFile); err != nil {
		return s, fmt.Errorf("writing the API server's CA for Prometheus: %w", err)
	}
	if s.certFile, err = file("apiserver-client.crt", tls.CertData, tls.CertFile); err != nil {
		return s, fmt.Errorf("writing the client certificate for Prometheus: %w", err)
	}
	if s.keyFile, err = file("apiserver-client.key", tls.KeyData, tls.KeyFile); err != nil {
		return s, fmt.Errorf("writing the client key for Prometheus: %w", err)
	}
	if cfg.BearerToken != "" || cfg.BearerTokenFile != "" {
		if s.tokenFile, err = file("apiserver.token", []byte(cfg.BearerToken), cfg.BearerTokenFile); err != nil {
			return s, fmt.Errorf("writing the API server token for Prometheus: %w", err)
		}
	}
	if s.certFile == "" && s.tokenFile == "" {
		return s, fmt.Errorf("the kubeconfig authenticates neither with a client certificate nor a token, which Prometheus needs to read the API server's /metrics")
	}
	return s, nil
}

// followTargets keeps Prometheus's replica targets and the load tester's
// gauges current, every scrape interval until ctx ends.
func (r *run) followTargets(ctx context.Context) {
	t := time.NewTicker(r.opts.SampleInterval / 2)
	defer t.Stop()
	for {
		var targets []promReplica
		if f := r.currentFleet(); f != nil {
			n := 0
			f.mu.Lock()
			for _, s := range f.slots {
				in := s.current()
				if in == nil || !in.proc.Running() {
					continue
				}
				n++
				u, err := url.Parse(in.metricsURL)
				if err != nil {
					continue
				}
				targets = append(targets, promReplica{addr: u.Host, fleet: f.id, replica: s.id, mode: f.mode.Name, process: in.n})
			}
			f.mu.Unlock()
			r.obs.setRunning(f.id, n)
		}
		if err := r.prom.setReplicas(targets); err != nil {
			r.log.Error(err, "Updating Prometheus's targets")
		}
		for reason, n := range r.tracker.reasons() {
			r.obs.reasons.WithLabelValues(strings.ToLower(reason)).Set(float64(n))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scraped returns once Prometheus has scraped everything after now: the
// start of a span, whose figures count from the last scrape before it.
func (r *run) scraped(ctx context.Context) {
	if err := r.prom.caughtUp(ctx, time.Now()); err != nil {
		r.log.Error(err, "Waiting for Prometheus to scrape")
	}
}

// measureFleet evaluates the report's queries over a stopped fleet.
func (r *run) measureFleet(ctx context.Context, f *fleet, res *FleetResult) {
	if err := r.prom.caughtUp(ctx, f.stopped.Add(r.opts.SampleInterval)); err != nil {
		r.log.Error(err, "Waiting for Prometheus to scrape the fleet's end")
	}
	limit, _ := r.opts.memoryLimitBytes()
	if f.mode.Plain {
		limit = 0
	}
	objects := r.tracker.count()
	w := queryWindow{fleet: f.id, step: r.opts.SampleInterval, memoryLimit: float64(limit), spans: map[string]span{
		"life":  {from: f.started, to: f.stopped, objects: objects},
		"phase": {from: f.loadFrom, to: f.loadTo, objects: objects},
	}}
	if cal := r.calibration; cal.measured() {
		w.ceiling = cal.WritesPerSec
	}
	if f.startObjects > 0 && f.startEvent.Error == "" {
		w.spans["start"] = span{from: f.started, to: f.started.Add(f.startEvent.Reconciled), objects: f.startObjects}
	}
	if s := f.storm; s.Kind != "" && !s.Began.IsZero() {
		w.spans["storm"] = span{from: s.Began, to: s.Began.Add(s.Duration), objects: s.Objects}
	}
	res.Figures = r.prom.figures(ctx, r.queries.Rows, w)
	res.ReplicaFigures = r.prom.replicaFigures(ctx, r.queries.Replicas, w)
}
