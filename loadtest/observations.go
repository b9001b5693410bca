package loadtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// observations are what only the load tester sees, as metrics its
// Prometheus scrapes beside the replicas' and the API server's: the time
// from a write to the watch showing it Ready, the labels, a config-center
// change reaching the ConfigMaps, its own writes. Published, not kept for a
// report of our own: the report's queries read them as they read every
// other figure, and a user's Prometheus could scrape them the same way.
type observations struct {
	reg *prometheus.Registry
	srv *http.Server
	// addr is "host:port" of /metrics.
	addr string

	// fleet labels every observation with the fleet running when it was
	// made (fleet.id; "" between fleets).
	mu    sync.Mutex
	fleet string
	// started is the fleet's start: an object it finds unlabeled is
	// labeled after it.
	started time.Time

	ready, labeled, propagation *prometheus.HistogramVec
	// grants times a grant probe's change (revoke or grant) until its
	// ConfigMap showed it; grantsLost counts those it never showed.
	grants                *prometheus.HistogramVec
	grantsLost            *prometheus.CounterVec
	sent, flaps, expected *prometheus.CounterVec
	changes               *prometheus.CounterVec
	// cfsPeriods and cfsThrottled are the CFS periods a replica process
	// held to a CPU quota ran in, and those that ended with its quota
	// spent (its cgroup's cpu.stat, cumulative).
	cfsPeriods, cfsThrottled *prometheus.GaugeVec
}

// latencyHistogram is a native histogram of seconds: a quantile within
// 5 % whatever the range, with no bucket bounds to choose.
func latencyHistogram(name, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: name, Help: help,
		NativeHistogramBucketFactor: 1.05, NativeHistogramMaxBucketNumber: 400,
		NativeHistogramMinResetDuration: time.Hour,
	}, labels)
}

// newObservations serves the load tester's metrics on a loopback port.
// ownWrites and ownSyncs are the load tester's own object writes and
// initial syncs of ConfigBindings, counted by its clients.
func newObservations(ownWrites, ownSyncs *atomic.Int64) (*observations, error) {
	o := &observations{
		reg: prometheus.NewRegistry(),
		ready: latencyHistogram("loadtest_ready_seconds",
			"From sending a write of a ConfigBinding to the watch showing it Ready at that generation (kind create or update).", "fleet", "kind"),
		labeled: latencyHistogram("loadtest_labeled_seconds",
			"From sending a create (or the fleet's start) to the watch showing the object's first shard label.", "fleet"),
		propagation: latencyHistogram("loadtest_propagation_seconds",
			"From a config-center value change to the watch showing it in every ConfigMap that binds its key.", "fleet"),
		grants: latencyHistogram("loadtest_authorization_seconds",
			"From a grant probe's grant revoked (change revoke) or given (grant) in SpiceDB to the watch showing its ConfigMap without or with its value.", "fleet", "change"),
		grantsLost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "loadtest_authorization_lost_total",
			Help: "Grant changes whose probe's ConfigMap did not show them within a minute."}, []string{"fleet", "change"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "loadtest_writes_sent_total",
			Help: "Writes of ConfigBindings the load generator sent (kind create, update or delete)."}, []string{"fleet", "kind"}),
		expected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "loadtest_propagation_expected_total",
			Help: "ConfigMaps that had to show a config-center change the load tester made, counted when they did or when the load tester stopped waiting: loadtest_propagation_seconds counts those that did."}, []string{"fleet"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "loadtest_value_changes_total",
			Help: "Config-center values the load tester changed to measure how fast a change reaches the ConfigMaps (result written or skipped: a tick with every writer busy, or no key free of an open probe)."}, []string{"fleet", "result"}),
		flaps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "loadtest_ready_flaps_total",
			Help: "Objects whose Ready went from True to not True at an unchanged generation."}, []string{"fleet"}),
		cfsPeriods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "loadtest_cgroup_cfs_periods",
			Help: "CFS periods a replica process held to --replica-cpu ran in (its cgroup's cpu.stat nr_periods, cumulative)."}, []string{"fleet", "replica", "process"}),
		cfsThrottled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "loadtest_cgroup_cfs_throttled_periods",
			Help: "CFS periods that ended with the replica process's quota spent (nr_throttled, cumulative)."}, []string{"fleet", "replica", "process"}),
	}
	o.reg.MustRegister(o.ready, o.labeled, o.propagation, o.grants, o.grantsLost, o.sent, o.flaps, o.expected, o.changes, o.cfsPeriods, o.cfsThrottled,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "loadtest_object_writes_total",
			Help: "Writes of ConfigBindings and ConfigMaps (any verb and subresource) the load tester sent: the API server's counts less these are the controllers'."},
			func() float64 { return float64(ownWrites.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "loadtest_initial_syncs_total",
			Help: "Initial syncs of ConfigBindings (LISTs and watch-lists) the load tester's own watch made: the API server's counts less these are the controllers'."},
			func() float64 { return float64(ownSyncs.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "loadtest_machine_load1",
			Help: "The machine's 1-minute load average: how much else competed for the CPUs."},
			func() float64 { l, _ := loadAverage(); return l }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("serving the load tester's metrics: %w", err)
	}
	o.addr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(o.reg, promhttp.HandlerOpts{}))
	o.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := o.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "serving the load tester's metrics: %v\n", err)
		}
	}()
	return o, nil
}

// close stops serving.
func (o *observations) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = o.srv.Shutdown(ctx)
}

// setFleet labels what is observed from now on with fleet, which started
// at started. Its series exist from now, at 0, so that a query of their
// increase over the fleet's life counts its first observation too.
func (o *observations) setFleet(fleet string, started time.Time) {
	o.mu.Lock()
	o.fleet, o.started = fleet, started
	o.mu.Unlock()
	if fleet == "" {
		return
	}
	for _, kind := range []writeKind{writeCreate, writeUpdate} {
		o.ready.WithLabelValues(fleet, kind.String())
		o.sent.WithLabelValues(fleet, kind.String())
	}
	o.labeled.WithLabelValues(fleet)
	o.propagation.WithLabelValues(fleet)
	o.expected.WithLabelValues(fleet)
	o.changes.WithLabelValues(fleet, "written")
	o.changes.WithLabelValues(fleet, "skipped")
	o.flaps.WithLabelValues(fleet)
	for _, change := range []string{"revoke", "grant"} {
		o.grants.WithLabelValues(fleet, change)
		o.grantsLost.WithLabelValues(fleet, change)
	}
}

func (o *observations) current() (string, time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.fleet, o.started
}

// The observations' methods do nothing on a nil *observations: the
// tracker's unit tests run without one.

// readyAfter records a write Ready after d.
func (o *observations) readyAfter(kind writeKind, d time.Duration) {
	if o == nil {
		return
	}
	fleet, _ := o.current()
	o.ready.WithLabelValues(fleet, kind.String()).Observe(d.Seconds())
}

// wrote counts a write sent.
func (o *observations) wrote(kind string) {
	if o == nil {
		return
	}
	fleet, _ := o.current()
	o.sent.WithLabelValues(fleet, kind).Inc()
}

// labeledAt records an object's first shard label at at, created at
// created (zero: before the fleet started, which is then its start).
func (o *observations) labeledAt(at, created time.Time) {
	if o == nil {
		return
	}
	fleet, started := o.current()
	if created.IsZero() || created.Before(started) {
		created = started
	}
	o.labeled.WithLabelValues(fleet).Observe(max(at.Sub(created), 0).Seconds())
}

// flapped counts a Ready flap.
func (o *observations) flapped() {
	if o == nil {
		return
	}
	fleet, _ := o.current()
	o.flaps.WithLabelValues(fleet).Inc()
}

// propagated records a config-center change seen in a ConfigMap after d.
func (o *observations) propagated(d time.Duration) {
	if o == nil {
		return
	}
	fleet, _ := o.current()
	o.propagation.WithLabelValues(fleet).Observe(d.Seconds())
}

// authorized records a grant change its probe's ConfigMap showed d after.
func (o *observations) authorized(change string, d time.Duration) {
	fleet, _ := o.current()
	o.grants.WithLabelValues(fleet, change).Observe(d.Seconds())
}

// authorizationLost records a grant change its probe's ConfigMap never
// showed.
func (o *observations) authorizationLost(change string) {
	fleet, _ := o.current()
	o.grantsLost.WithLabelValues(fleet, change).Inc()
}

// valueChanged counts a change the propagation probes made, or one they
// skipped.
func (o *observations) valueChanged(written bool) {
	fleet, _ := o.current()
	result := "skipped"
	if written {
		result = "written"
	}
	o.changes.WithLabelValues(fleet, result).Inc()
}

// propagationExpected counts n ConfigMaps that must show a change.
func (o *observations) propagationExpected(n int) {
	fleet, _ := o.current()
	o.expected.WithLabelValues(fleet).Add(float64(n))
}

// String names the kind in the metrics' labels.
func (k writeKind) String() string {
	if k == writeCreate {
		return "create"
	}
	return "update"
}

// loadAverage is the machine's 1-minute load average, from /proc/loadavg.
func loadAverage() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}
