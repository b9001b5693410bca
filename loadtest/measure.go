package loadtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

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
// gauges and the progress line current, twice a scrape interval, until
// ctx ends.
func (r *run) followTargets(ctx context.Context) {
	t := time.NewTicker(r.opts.SampleInterval / 2)
	defer t.Stop()
	for {
		var targets []promReplica
		if f := r.fleets.running(); f != nil {
			f.mu.Lock()
			for _, s := range f.slots {
				in := s.current()
				if in == nil || !in.proc.Running() {
					continue
				}
				u, err := url.Parse(in.metricsURL)
				if err != nil {
					continue
				}
				targets = append(targets, promReplica{addr: u.Host, fleet: f.id, replica: s.id, mode: f.mode.Name, process: in.n})
				if in.cgroup != "" {
					if t, err := r.cpuQuota.throttling(in.cgroup); err == nil {
						labels := []string{f.id, s.id, strconv.Itoa(in.n)}
						r.obs.cfsPeriods.WithLabelValues(labels...).Set(float64(t.Periods))
						r.obs.cfsThrottled.WithLabelValues(labels...).Set(float64(t.Throttled))
					}
				}
			}
			f.mu.Unlock()
		}
		if err := r.prom.setReplicas(targets); err != nil {
			r.log.Error(err, "Updating Prometheus's targets")
		}
		reasons := r.tracker.reasons()
		r.mu.Lock()
		phase := r.phase
		r.mu.Unlock()
		f := r.fleets.running()
		label, size := "", 0
		if f != nil {
			label, size = f.label(), f.size()
		}
		r.progress.update(r.status(label, phase, size, reasons))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// spanStart starts a span of the run whose figures count from its start
// (promServer.spanStart), and returns the start.
func (r *run) spanStart(ctx context.Context) time.Time {
	at, err := r.prom.spanStart(ctx)
	if err != nil {
		r.log.Error(err, "Waiting for Prometheus to scrape")
	}
	return at
}

// status is the progress line.
func (r *run) status(fleet, phase string, size int, reasons map[string]int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.elapsed(), r.opts.Scenario)
	if fleet != "" {
		fmt.Fprintf(&b, " | %s (%d running)", fleet, size)
	}
	if phase != "" {
		fmt.Fprintf(&b, " | %s", phase)
	}
	st := &r.gen.stats
	fmt.Fprintf(&b, " | objects %d, Ready %d | writes: %d creates, %d updates, %d errors | waiting for Ready: %d",
		r.tracker.count(), reasons["Synced"], st.creates.Load(), st.updates.Load(), st.errors.Load(), r.tracker.pendingCount())
	return b.String()
}

// measureFleet evaluates the report's queries over a stopped fleet.
func (rp reporter) measureFleet(ctx context.Context, f *fleet, res *FleetResult) {
	r := rp.r
	if err := r.prom.caughtUp(ctx, f.stopped.Add(r.opts.SampleInterval)); err != nil {
		r.log.Error(err, "Waiting for Prometheus to scrape the fleet's end")
	}
	limit, _ := r.opts.memoryLimitBytes()
	if f.mode.Plain {
		limit = 0
	}
	objects := r.tracker.count()
	w := queryWindow{fleet: f.id, step: r.opts.SampleInterval, memoryLimit: float64(limit), sharded: f.mode.Sharded(), cache: f.mode.readsCache(), authorized: f.mode.authorized(), spans: map[string]span{
		"life":  {from: f.started, to: f.stopped, objects: objects},
		"phase": {from: f.loadFrom, to: f.loadTo, objects: objects},
	}}
	if cal := r.calibration; cal.measured() {
		w.ceiling = cal.WritesPerSec
	}
	if r.opts.ValueChangeInterval > 0 {
		w.spans["probes"] = w.spans["phase"]
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

// measureEvents evaluates the events queries over every event whose
// writes the run counted.
func (rp reporter) measureEvents(ctx context.Context) {
	r := rp.r
	for i := range r.report.Events {
		ev := &r.report.Events[i]
		if !ev.WritesCounted {
			continue
		}
		at := r.begin.Add(ev.At)
		w := queryWindow{step: r.opts.SampleInterval, sharded: true, spans: map[string]span{"event": {from: at, to: at.Add(ev.Reconciled), objects: ev.Objects}}}
		if err := r.prom.caughtUp(ctx, at.Add(ev.Reconciled+r.opts.SampleInterval)); err != nil {
			r.log.Error(err, "Waiting for Prometheus to scrape an event's end")
		}
		ev.Figures = r.prom.figures(ctx, r.queries.Events, w)
	}
}

// The figures (queries/fleets.yaml) the load tester's own findings read;
// TestQueriesParse holds them to the file.
const (
	figHeapPeak       = "heap in use per replica, peak (largest)"
	figHeapEnd        = "heap in use per replica at the end of the load (largest)"
	figHeapEndSum     = "heap in use, whole fleet at the end of the load (sum of replicas)"
	figLiveHeapPeak   = "live heap per replica, peak (largest; go_gc_heap_live_bytes, marked live by the last collection)"
	figLiveHeapEnd    = "live heap per replica at the end of the load (largest)"
	figLiveHeapEndSum = "live heap, whole fleet at the end of the load (sum of replicas)"
	figStartSyncs     = "fleet start: initial syncs of ConfigBindings (LISTs + watch-lists, the load tester's own subtracted)"
	figStartWalked    = "fleet start: ConfigBindings the API server walked ÷ objects (every client)"
	figEventWrites    = "object writes"
)

// updatesBetween are the spec updates seen Ready from from until to, and
// their p99, as text for a finding.
func (p *promServer) updatesBetween(ctx context.Context, from, to time.Time) (count, p99 string) {
	span := fmt.Sprintf("[%dms]", max(to.Sub(from).Milliseconds(), 1))
	h := `sum(increase(loadtest_ready_seconds{kind="update"}` + span + `))`
	count, p99 = noData, noData
	if v, err := p.scalar(ctx, "histogram_count("+h+")", to); err == nil {
		count = fmt.Sprintf("%.0f", v)
	}
	if v, err := p.scalar(ctx, "histogram_quantile(0.99, "+h+")", to); err == nil {
		p99 = fmtDur(time.Duration(v * float64(time.Second)))
	}
	return count, p99
}

// cpuSeconds is the CPU a scraped job's process used from from until to.
func (p *promServer) cpuSeconds(ctx context.Context, job string, from, to time.Time) (float64, bool) {
	v, err := p.scalar(ctx, fmt.Sprintf(`sum(increase(process_cpu_seconds_total{job=%q}[%dms]))`, job, max(to.Sub(from).Milliseconds(), 1)), to)
	return v, err == nil
}

// live is the sum of what q selects, now: a fleet's state as its replicas
// export it (work queues, fetches, reconciles), at most a scrape interval
// old, for the settle's waits: errNoData when q selects nothing.
func (p *promServer) live(ctx context.Context, q string) (float64, error) {
	v, err := p.vector(ctx, liveQuery(q, 2*p.interval), time.Now())
	if err != nil {
		return 0, err
	}
	if len(v) == 0 {
		return 0, errNoData
	}
	return float64(v[0].Value), nil
}

// liveQuery sums the last value within window of what selector selects.
func liveQuery(selector string, window time.Duration) string {
	return fmt.Sprintf("sum(last_over_time(%s[%dms]))", selector, window.Milliseconds())
}

// selector selects the fleet's replicas' series of metric, with more
// label matchers in extra ("" for none).
func (f *fleet) selector(metric, extra string) string {
	s := fmt.Sprintf(`%s{job=%q,fleet=%q`, metric, jobReplicas, f.id)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

// value is the figure of the given name (queries/fleets.yaml), false when
// it has no data.
func (res *FleetResult) value(name string) (float64, bool) {
	for _, x := range res.Figures {
		if x.Name == name {
			return x.Value, x.NoData == ""
		}
	}
	return 0, false
}
