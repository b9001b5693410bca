package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"

	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/controlplane"
)

// PrometheusEnv names the Prometheus server the load tester runs when
// Options.Prometheus is empty (make sets it to bin/prometheus, built from
// the pinned module of hack/prometheus).
const PrometheusEnv = "PROMETHEUS"

// The jobs of the load tester's Prometheus: the queries select by them.
const (
	jobReplicas     = "replicas"
	jobAPIServer    = "apiserver"
	jobEtcd         = "etcd"
	jobConfigCenter = "configcenter"
	jobConfigEtcd   = "config-etcd"
	jobSpiceDB      = "spicedb"
	jobLoadTester   = "loadtest"
)

// promServer is the Prometheus a run measures through: it scrapes the
// replicas (a file of targets the run rewrites as they come and go), the
// API server, the control plane's etcd, the config center and the load
// tester's own observations, and every figure of the report is a PromQL
// query against it, as a user's dashboard and alerts are. A real server and
// not a parser of our own: what the report says is what a user's
// Prometheus would say of the same run.
type promServer struct {
	api promv1.API
	url string
	// interval is the scrape interval of the replicas, the config center
	// and the load tester: a figure is as fresh as one. controlPlane is
	// the API server's and its etcd's (controlPlaneInterval).
	interval, controlPlane time.Duration
	// targets is the replicas' file_sd file.
	targets string
	// static are the jobs of one fixed target each; absent are the jobs
	// it does not scrape (no etcd of a cluster the load tester did not
	// start): their figures are not a lack of data.
	static, absent []string

	mu      sync.Mutex
	written []byte
}

// promScrape is how one job is scraped.
type promScrape struct {
	// addr is "host:port"; empty leaves the job out.
	addr   string
	scheme string
	// caFile, certFile and keyFile are TLS files; insecure skips verifying
	// the server (the replicas' self-signed serving certificates).
	caFile, certFile, keyFile string
	insecure                  bool
	// tokenFile is a bearer token's file.
	tokenFile string
}

// promOptions are what a run's Prometheus scrapes.
type promOptions struct {
	binary, dir string
	interval    time.Duration
	// replicas is how the replicas are scraped (addr unused: the targets
	// file lists them).
	replicas                promScrape
	apiServer, etcd, tester promScrape
	// configCenter is the stand-in config center, configEtcd the etcd one:
	// a run has one of them, and the queries of the other say "not
	// scraped".
	configCenter, configEtcd promScrape
	// spicedb is the run's SpiceDB, when a fleet is authorized.
	spicedb promScrape
}

// startPrometheus starts a Prometheus under procs with its data in
// o.dir, and waits until it is ready.
func startPrometheus(ctx context.Context, procs *childproc.Supervisor, o promOptions) (*promServer, error) {
	if o.binary == "" {
		o.binary = os.Getenv(PrometheusEnv)
	}
	if o.binary == "" {
		root, err := controlplane.RepoRoot()
		if err != nil {
			return nil, fmt.Errorf("finding Prometheus (set $%s or --prometheus): %w", PrometheusEnv, err)
		}
		o.binary = filepath.Join(root, "bin", "prometheus")
	}
	if _, err := os.Stat(o.binary); err != nil {
		return nil, fmt.Errorf("the load tester measures through Prometheus (`make prometheus-tools` builds it): %w", err)
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating Prometheus's folder: %w", err)
	}
	p := &promServer{interval: o.interval, controlPlane: controlPlaneInterval(o.interval), targets: filepath.Join(o.dir, "replicas.json")}
	for job, s := range map[string]promScrape{jobAPIServer: o.apiServer, jobEtcd: o.etcd, jobConfigCenter: o.configCenter, jobConfigEtcd: o.configEtcd, jobSpiceDB: o.spicedb, jobLoadTester: o.tester} {
		if s.addr == "" {
			p.absent = append(p.absent, job)
		} else {
			p.static = append(p.static, job)
		}
	}
	if err := p.setReplicas(nil); err != nil {
		return nil, err
	}
	config, err := yaml.Marshal(promConfig(o, p.targets))
	if err != nil {
		return nil, fmt.Errorf("writing Prometheus's configuration: %w", err)
	}
	configFile := filepath.Join(o.dir, "prometheus.yml")
	if err := os.WriteFile(configFile, config, 0o600); err != nil {
		return nil, fmt.Errorf("writing Prometheus's configuration: %w", err)
	}
	ports, err := childproc.FreePorts(1)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	if _, err := procs.Start("prometheus", o.binary, filepath.Join(o.dir, "prometheus.log"),
		"--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(o.dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn",
		// A replica's targets apply half a second after the file names
		// them, not the default 5 s: a fleet's first seconds are its start.
		"--scrape.discovery-reload-interval=500ms"); err != nil {
		return nil, err
	}
	p.url = "http://" + addr
	c, err := promapi.NewClient(promapi.Config{Address: p.url})
	if err != nil {
		return nil, fmt.Errorf("the Prometheus client: %w", err)
	}
	p.api = promv1.NewAPI(c)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/-/ready", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				// Every figure's start is after the first scrape of the
				// API server and the others.
				return p, p.caughtUp(ctx, time.Now())
			}
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, fmt.Errorf("waiting for Prometheus at %s: %w", p.url, err)
		}
	}
}

// controlPlaneInterval is how often the API server and its etcd are
// scraped when the rest is every interval: twice as long, at least 2 s.
// The API server's /metrics is some 21,000 series; on a loaded 2-core
// machine rendering and parsing them took up to a second, and a scrape
// timed out at a 1 s interval (Prometheus's timeout is at most its
// interval), leaving a short phase with no sample of the API server.
func controlPlaneInterval(interval time.Duration) time.Duration {
	return max(2*interval, 2*time.Second)
}

// promConfig is Prometheus's configuration for o.
func promConfig(o promOptions, targets string) map[string]any {
	interval := model.Duration(o.interval).String()
	controlPlane := model.Duration(controlPlaneInterval(o.interval)).String()
	job := func(name string, s promScrape) map[string]any {
		j := map[string]any{"job_name": name, "scheme": s.scheme}
		if name == jobAPIServer || name == jobEtcd {
			j["scrape_interval"], j["scrape_timeout"] = controlPlane, controlPlane
		}
		if j["scheme"] == "" {
			j["scheme"] = "http"
		}
		tls := map[string]any{}
		for k, v := range map[string]string{"ca_file": s.caFile, "cert_file": s.certFile, "key_file": s.keyFile} {
			if v != "" {
				tls[k] = v
			}
		}
		if s.insecure {
			tls["insecure_skip_verify"] = true
		}
		if len(tls) > 0 {
			j["tls_config"] = tls
		}
		if s.tokenFile != "" {
			j["authorization"] = map[string]any{"credentials_file": s.tokenFile}
		}
		if s.addr != "" {
			j["static_configs"] = []any{map[string]any{"targets": []string{s.addr}}}
		}
		return j
	}
	replicas := job(jobReplicas, o.replicas)
	tester := job(jobLoadTester, o.tester)
	// The load tester's latencies are native histograms: quantiles within
	// a few percent, with no buckets to choose. The services' histograms
	// are read as their classic buckets, as the dashboard's queries are.
	tester["scrape_native_histograms"] = true
	replicas["file_sd_configs"] = []any{map[string]any{"files": []string{targets}, "refresh_interval": interval}}
	jobs := []any{replicas}
	for _, j := range []struct {
		name string
		s    promScrape
	}{{jobAPIServer, o.apiServer}, {jobEtcd, o.etcd}, {jobConfigCenter, o.configCenter}, {jobConfigEtcd, o.configEtcd}, {jobSpiceDB, o.spicedb}} {
		if j.s.addr != "" {
			jobs = append(jobs, job(j.name, j.s))
		}
	}
	jobs = append(jobs, tester)
	return map[string]any{
		"global": map[string]any{
			"scrape_interval": interval, "scrape_timeout": interval,
		},
		"scrape_configs": jobs,
	}
}

// promReplica is one replica process Prometheus scrapes, and the labels
// its series carry: the queries select a fleet's by them.
type promReplica struct {
	addr                 string
	fleet, replica, mode string
	process              int
}

// setReplicas rewrites the replicas' targets file, when it changed. A
// replica that is gone from it gets its series marked stale at the next
// refresh.
func (p *promServer) setReplicas(rs []promReplica) error {
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	groups := make([]group, 0, len(rs))
	for _, r := range rs {
		groups = append(groups, group{Targets: []string{r.addr}, Labels: map[string]string{
			"fleet": r.fleet, "replica": r.replica, "mode": r.mode, "process": strconv.Itoa(r.process)}})
	}
	b, err := json.Marshal(groups)
	if err != nil {
		return fmt.Errorf("writing Prometheus's targets: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if slices.Equal(b, p.written) {
		return nil
	}
	tmp := p.targets + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing Prometheus's targets: %w", err)
	}
	if err := os.Rename(tmp, p.targets); err != nil {
		return fmt.Errorf("writing Prometheus's targets: %w", err)
	}
	p.written = b
	return nil
}

// errNoData is a query with no result: a figure without data, never a 0.
var errNoData = errors.New("no data")

// vector evaluates q at t.
func (p *promServer) vector(ctx context.Context, q string, t time.Time) (model.Vector, error) {
	v, warnings, _, err := p.api.Query(ctx, q, t)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	if len(warnings) > 0 {
		return nil, fmt.Errorf("query %s: %v", q, warnings)
	}
	switch v := v.(type) {
	case model.Vector:
		return v, nil
	case *model.Scalar:
		return model.Vector{{Value: v.Value, Timestamp: v.Timestamp}}, nil
	default:
		return nil, fmt.Errorf("query %s: a %s, not a vector", q, v.Type())
	}
}

// scalar evaluates q at t, which must give one sample; errNoData when it
// gives none, NaN or an infinity (a ratio over nothing).
func (p *promServer) scalar(ctx context.Context, q string, t time.Time) (float64, error) {
	v, err := p.vector(ctx, q, t)
	if err != nil {
		return 0, err
	}
	switch {
	case len(v) == 0:
		return 0, fmt.Errorf("query %s: %w", q, errNoData)
	case len(v) > 1:
		return 0, fmt.Errorf("query %s: %d samples, want one", q, len(v))
	case math.IsNaN(float64(v[0].Value)):
		return 0, fmt.Errorf("query %s: %w (NaN)", q, errNoData)
	case math.IsInf(float64(v[0].Value), 0):
		return 0, fmt.Errorf("query %s: %w (infinite: a denominator of 0)", q, errNoData)
	}
	return float64(v[0].Value), nil
}

// firstScrapeAfter is when Prometheus next scraped every target after t:
// the latest, over the targets scraped both before and after t, of each
// one's first successful scrape after it. A query at that time reads every
// target as it stood after t, however late the scrapes came on a loaded
// machine; a query one interval after t would read the scrape before t of
// a target scraped late, or none of one whose scrapes failed. False when
// no target was scraped after t within the window caughtUp waits.
func (p *promServer) firstScrapeAfter(ctx context.Context, t time.Time) (time.Time, bool, error) {
	wait := p.patience()
	q := fmt.Sprintf("up[%dms]", (2 * wait).Milliseconds())
	v, _, _, err := p.api.Query(ctx, q, t.Add(wait))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("query %s: %w", q, err)
	}
	m, ok := v.(model.Matrix)
	if !ok {
		return time.Time{}, false, fmt.Errorf("query %s: a %s, not a matrix", q, v.Type())
	}
	var at time.Time
	for _, series := range m {
		before, after := false, time.Time{}
		for _, s := range series.Values {
			switch ts := s.Timestamp.Time(); {
			case s.Value != 1: // a failed scrape
			case ts.Before(t):
				before = true
			case after.IsZero():
				after = ts
			}
		}
		if before && after.After(at) {
			at = after
		}
	}
	return at, !at.IsZero(), nil
}

// patience is how long a wait for a scrape lasts: ten of the longest
// scrape interval, or 10 s if longer. A target that answers no more is no
// reason to wait longer.
func (p *promServer) patience() time.Duration { return max(10*p.controlPlane, 10*time.Second) }

// scrapedAfter waits for job's first successful scrape after t, for as
// long as caughtUp waits for all, and returns its time.
func (p *promServer) scrapedAfter(ctx context.Context, job string, t time.Time) (time.Time, error) {
	deadline := time.Now().Add(p.patience())
	for {
		// The raw samples of up since t: a scrape's, not a lookback's.
		now := time.Now()
		q := fmt.Sprintf("up{job=%q}[%dms]", job, max(now.Sub(t).Milliseconds(), 1))
		if v, _, _, err := p.api.Query(ctx, q, now); err == nil {
			if m, ok := v.(model.Matrix); ok {
				for _, series := range m {
					for _, s := range series.Values {
						if s.Value == 1 && s.Timestamp.Time().After(t) {
							return s.Timestamp.Time(), nil
						}
					}
				}
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no successful scrape of job %s since %s", job, t.Format(time.RFC3339))
		}
		if err := sleep(ctx, p.interval/2); err != nil {
			return time.Time{}, err
		}
	}
}

// readEnds sets when each span of w ends is read: the first scrape after
// it (firstScrapeAfter), or, for a span after which nothing was scraped,
// one step after it. A query that fails here fails again in the figure,
// which says why.
func (p *promServer) readEnds(ctx context.Context, w queryWindow) queryWindow {
	spans := make(map[string]span, len(w.spans))
	for name, sp := range w.spans {
		sp.end = sp.to.Add(w.step)
		if at, ok, err := p.firstScrapeAfter(ctx, sp.to); err == nil && ok {
			sp.end = at
		}
		spans[name] = sp
	}
	w.spans = spans
	w.last = 2 * p.controlPlane
	return w
}

// spanStart takes the start of a span whose counts are read at it: once
// every target was scraped after now (the quiet before the span), it takes
// the start, and returns it once every target finished a scrape begun
// after it, before the span's work begins. Prometheus stamps a sample with
// its scrape's start, and a scrape under way at the start (the API
// server's takes up to its 2 s timeout on a loaded machine) would read
// what the span does at once and count it before the span: a figure of
// the span would then miss it, or read no data when nothing else changed.
func (p *promServer) spanStart(ctx context.Context) (time.Time, error) {
	if err := p.caughtUp(ctx, time.Now()); err != nil {
		return time.Now(), err
	}
	at := time.Now()
	return at, p.caughtUp(ctx, at)
}

// caughtUp waits until Prometheus has scraped (or tried) every target,
// each fixed one included, at least once after t, so a query at t reads
// the moment t: a figure at a phase's edge must not be the scrape before
// it. It gives up after patience.
func (p *promServer) caughtUp(ctx context.Context, t time.Time) error {
	deadline := time.Now().Add(p.patience())
	for {
		targets, err := p.api.Targets(ctx)
		if err != nil {
			return fmt.Errorf("reading Prometheus's targets: %w", err)
		}
		behind := 0
		seen := map[string]bool{}
		for _, at := range targets.Active {
			if at.LastScrape.Before(t) {
				behind++
			}
			seen[at.ScrapePool] = true
		}
		for _, job := range p.static {
			if !seen[job] {
				behind++ // not a target yet: Prometheus applies its config
			}
		}
		if behind == 0 || time.Now().After(deadline) {
			return nil
		}
		if err := sleep(ctx, p.interval/4); err != nil {
			return err
		}
	}
}
