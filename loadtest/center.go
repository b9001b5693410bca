package loadtest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/netfault"
)

// The config centers a run can have (Options.ConfigCenter).
const (
	// CenterEtcd is an etcd of the run's own (internal/configetcd), read
	// through a proxy that adds the latency (internal/netfault): the store
	// users run, and the replicas' default.
	CenterEtcd = "etcd"
	// CenterHTTP is kshard's stand-in (cmd/configcenter), which can also
	// add jitter and fail a share of requests.
	CenterHTTP = "http"
)

// center is the run's config center: the load tester seeds it, changes a
// value in it (a propagation probe), takes it away (an outage), and points
// the replicas and Prometheus at it.
type center interface {
	// put writes one key's value.
	put(ctx context.Context, domain, key, value string) error
	// setOutage takes the center away, or brings it back; outage says
	// how, for the progress output and the report.
	setOutage(ctx context.Context, on bool) error
	outage() string
	// args are the flags that point a replica at it, kshard's and the plain
	// controller's alike.
	args() []string
	// scrape is how Prometheus reads its /metrics, and under which job.
	scrape() (job string, s promScrape)
	// String says what it is, for the progress output and the report.
	String() string
	// close stops what the run started for it.
	close()
}

// httpCenter is kshard's stand-in config center: the load tester's process,
// or a cluster's (connectCenter), faulted through its admin API.
type httpCenter struct {
	url    string
	cc     *configcenter.Client
	faults configcenter.Faults
	desc   string
}

func (h *httpCenter) put(ctx context.Context, domain, key, value string) error {
	_, err := h.cc.Put(ctx, domain, key, value)
	return err
}

// setOutage answers 503 to every data request, keeping the other faults.
func (h *httpCenter) setOutage(ctx context.Context, on bool) error {
	f := h.faults
	f.Outage = on
	return h.cc.SetFaults(ctx, f)
}

func (h *httpCenter) outage() string { return "answers 503 to every data request" }

func (h *httpCenter) args() []string {
	return []string{"--config-center", CenterHTTP, "--configcenter-url", h.url}
}

func (h *httpCenter) scrape() (string, promScrape) {
	u, err := url.Parse(h.url)
	if err != nil {
		return jobConfigCenter, promScrape{}
	}
	return jobConfigCenter, promScrape{addr: u.Host, scheme: u.Scheme}
}

func (h *httpCenter) String() string { return h.desc }
func (h *httpCenter) close()         {}

// startHTTPCenter starts the stand-in as a child process with the run's
// data and faults, and waits until it answers.
func startHTTPCenter(ctx context.Context, o Options, procs *childproc.Supervisor, bin, work string) (*httpCenter, error) {
	ports, err := childproc.FreePorts(1)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	h := &httpCenter{url: "http://" + addr, faults: o.centerFaults(),
		desc: fmt.Sprintf("kshard's stand-in (cmd/configcenter) at http://%s: %d domains × %d keys of %d bytes, %s latency + up to %s jitter, %g error rate",
			addr, o.Domains, o.KeysPerDomain, o.ValueBytes, o.Latency, o.Jitter, o.ErrorRate)}
	if _, err := procs.Start("configcenter", bin, filepath.Join(work, "logs", "configcenter.log"),
		"--listen", addr,
		"--seed-domains", strconv.Itoa(o.Domains),
		"--keys-per-domain", strconv.Itoa(o.KeysPerDomain),
		"--value-bytes", strconv.Itoa(o.ValueBytes),
		"--latency", o.Latency.String(),
		"--jitter", o.Jitter.String(),
		"--error-rate", strconv.FormatFloat(o.ErrorRate, 'g', -1, 64),
	); err != nil {
		return nil, err
	}
	if h.cc, err = configcenter.NewClient(configcenter.ClientOptions{BaseURL: h.url, Caller: loadtestCaller}); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(h.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return h, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the config center at %s did not answer within a minute: %v", h.url, err)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// etcdCenter is an etcd of the run's own, seeded as etcdsource reads it,
// behind a proxy that delays every request by the run's latency.
type etcdCenter struct {
	srv    *configetcd.Server
	client *clientv3.Client
	proxy  *netfault.Proxy
	desc   string
}

func (e *etcdCenter) put(ctx context.Context, domain, key, value string) error {
	_, err := e.client.Put(ctx, etcdsource.DefaultPrefix+"/"+domain+"/"+key, value)
	return err
}

// setOutage stops every etcd member (their data kept), or starts them
// again and waits until etcd answers: an outage the replicas see as
// connections refused, as a real etcd's would be.
func (e *etcdCenter) setOutage(ctx context.Context, on bool) error {
	if on {
		return e.srv.Stop(5 * time.Second)
	}
	return e.srv.Restart(ctx)
}

func (e *etcdCenter) outage() string { return "is stopped (every etcd member, its data kept)" }

func (e *etcdCenter) args() []string {
	return []string{"--config-center", CenterEtcd, "--etcd-servers", "http://" + e.proxy.Addr()}
}

// scrape reads etcd's /metrics on its client URL, not through the proxy:
// the latency is the replicas', not Prometheus's.
func (e *etcdCenter) scrape() (string, promScrape) {
	return jobConfigEtcd, promScrape{addr: strings.TrimPrefix(e.srv.Endpoint(), "http://"), scheme: "http"}
}

func (e *etcdCenter) String() string { return e.desc }

func (e *etcdCenter) close() {
	if e.proxy != nil {
		_ = e.proxy.Close()
	}
	_ = e.client.Close()
	_ = e.srv.Close()
}

// startEtcdCenter starts an etcd of the run's own, seeds it, and puts the
// proxy with the run's latency in front of it.
func startEtcdCenter(ctx context.Context, o Options, work string) (*etcdCenter, error) {
	srv, err := configetcd.Start(ctx, configetcd.Options{Dir: filepath.Join(work, "config-etcd")})
	if err != nil {
		return nil, err
	}
	e := &etcdCenter{srv: srv}
	if e.client, err = srv.Client(); err != nil {
		_ = srv.Close()
		return nil, err
	}
	seeded := configcenter.SeedOptions{Domains: o.Domains, KeysPerDomain: o.KeysPerDomain, ValueBytes: o.ValueBytes}
	if _, err := configetcd.Seed(ctx, e.client, etcdsource.DefaultPrefix, seeded); err != nil {
		e.close()
		return nil, err
	}
	if e.proxy, err = netfault.Listen(strings.TrimPrefix(srv.Endpoint(), "http://")); err != nil {
		e.close()
		return nil, err
	}
	e.proxy.SetLatency(o.Latency)
	e.desc = fmt.Sprintf("etcd (the control plane's etcd binary, a member of its own) at %s, %s latency per request (a proxy in front): %d domains × %d keys of %d bytes under %s",
		srv.Endpoint(), o.Latency, o.Domains, o.KeysPerDomain, o.ValueBytes, etcdsource.DefaultPrefix)
	return e, nil
}
