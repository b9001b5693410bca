package loadtest

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kshard/kshard/internal/audit"
)

// Report is what a run measured and concluded. It is written as Markdown
// with SVG charts, and as JSON for tools.
type Report struct {
	Scenario    string
	Description string
	Command     string
	Machine     Machine
	Started     time.Time
	Wall        time.Duration
	Settings    [][2]string
	// Source is the commit of the source tree the run measured.
	Source Source
	// Gated says the checks decide the exit code (chaos, rolling-restart);
	// elsewhere they are reported only.
	Gated  bool
	Passed bool
	// Error is why the run itself failed, if it did.
	Error  string `json:",omitempty"`
	Checks []Check
	// Writes is what the API server's audit log showed of the replicas'
	// writes, and Audit what the replicas' audit logs showed of their
	// reconciles, for a run with a sharded fleet.
	Writes *WriteEvidence `json:",omitempty"`
	Audit  *AuditSummary  `json:",omitempty"`
	Fleets []*FleetResult
	Events []EventResult
	// Updates and Creates are the end-to-end latencies of every measured
	// phase of the run; Labeled is the part of a create until the elected
	// leader's shard label shows.
	Updates, Creates, Labeled LatencySummary
	// Capacity is each fleet's capacity, for the capacity scenario.
	Capacity []CapacityResult `json:",omitempty"`
	// Findings are scenario-specific observations (an outage's effect, the
	// HPA's decisions), one sentence each.
	Findings []string
	Notes    []string
	Charts   []Chart
	// guide is the link from the report to loadtest/README.md; "" for the
	// default report folder's.
	guide string
}

// Machine is where the run ran: its numbers hold for this machine.
type Machine struct {
	CPUs          int
	CPUModel      string
	GoVersion     string
	OS            string
	KubeAPIServer string
	// LoadMean and LoadMax are the 1-minute load average during the run
	// (sampled): how busy the machine was, with everything else on it; -1
	// without a sample (not Linux).
	LoadMean, LoadMax float64
	// Calibration is the API server's write ceiling measured before the
	// first fleet; nil when turned off (--calibrate-for 0).
	Calibration *Calibration `json:",omitempty"`
	// Pods says which StatefulSet's pods the replicas were
	// (Options.StatefulSet); empty when they were the load tester's
	// processes.
	Pods string `json:",omitempty"`
}

// Check is one invariant the run verified. A check passes on data only: one
// with nothing to decide on (no audit record, no object, no sample) fails
// with NoData set, as a check that saw nothing proves nothing. One about
// something the run did not have (no sharded fleet, no memory limit)
// passes with NotApplicable set. Detail says which, and why.
type Check struct {
	Name          string
	Passed        bool
	NoData        bool `json:",omitempty"`
	NotApplicable bool `json:",omitempty"`
	Detail        string
}

// noDataCheck is a check that had nothing to decide on: it fails.
func noDataCheck(name, why string) Check {
	return Check{Name: name, NoData: true, Detail: "no data: " + why}
}

// notApplicableCheck is a check about something the run did not have: it
// passes.
func notApplicableCheck(name, why string) Check {
	return Check{Name: name, Passed: true, NotApplicable: true, Detail: "not applicable: " + why}
}

// Chart is one chart file of the report.
type Chart struct {
	Title, File string
}

// LatencySummary summarises end-to-end latencies: from the write of a
// generation to the watch showing status Ready at it. With Count 0 there is
// no data: the percentiles are 0 and the shares -1, and the report says "no
// data" for all of them.
type LatencySummary struct {
	Count              int
	P50, P90, P99, Max time.Duration
	// WithinFast and WithinSLO are the shares at or below 1 s and 5 s; -1
	// without samples.
	WithinFast, WithinSLO float64
	// Buckets count the samples per LatencyBuckets bound, the last above
	// every bound.
	Buckets []int
}

func summarize(h *histogram) LatencySummary {
	s := LatencySummary{
		Count: h.Count(), P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99), Max: h.Max(),
		WithinFast: h.Within(SLOFast), WithinSLO: h.Within(SLO), Buckets: h.Buckets(),
	}
	if s.Count == 0 {
		// The histogram's "nothing missed" is no share of anything.
		s.WithinFast, s.WithinSLO = -1, -1
	}
	return s
}

// FleetResult is what one fleet did: its measured phase (load) and its whole
// life (start to stop) for memory and LISTs.
type FleetResult struct {
	Fleet string
	Mode  string
	Args  []string
	// Plain says the fleet ran cmd/plaincontroller (no kshard code), not
	// `kshard controller`: it has no audit log and no kshard_* metrics.
	Plain    bool `json:",omitempty"`
	Replicas int
	// Processes counts the replica processes started, restarts included.
	Processes int
	Lifetime  time.Duration
	// Window is the measured phase.
	Window time.Duration
	// Samples counts the scrapes of the fleet's replicas over its life:
	// without any, every figure from their metrics (memory, CPU,
	// reconciles, objects held) has no data.
	Samples int
	// StartSettled is the fleet's start event's settle time: from its first
	// process until every replica was ready, every object reconciled by the
	// fleet (audit logs when sharded; the reconcile counters reaching the
	// object count with empty queues otherwise) and Ready at its latest
	// generation. StartError says why it did not settle.
	// StartObjects is the number of objects then.
	StartSettled time.Duration
	StartError   string `json:",omitempty"`
	StartObjects int
	// StartWritesCounted says the API server was read at both ends of the
	// start; StartWrites is then the ConfigBinding and ConfigMap writes
	// during it, the load tester's own subtracted (it sends none then).
	StartWritesCounted bool
	StartWrites        float64
	// ShardTableDomains is the domains in the labeler's shard table when a
	// sharded fleet started: those whose objects the shard-label policy
	// labels at their CREATE. -1 for no table (a cold start: the labeler
	// labels every object of a new domain), and for fleets without a
	// labeler.
	ShardTableDomains int
	// StartScanned is the ConfigBindings the API server scanned for the
	// initial syncs of the fleet's start (until it settled), and StartSyncs
	// those syncs, the load tester's own subtracted; -1 when the API server
	// was not read at both ends, or restarted in between. A replica's sync
	// scans every object whatever its selector, so a fleet of N replicas
	// and the labeler's cache scans each object N+1 times at best.
	StartScanned, StartSyncs float64

	Updates LatencySummary
	// Throughput is generations seen Ready per second in the window;
	// Offered the updates issued per second.
	Throughput, Offered float64
	Reconciles          float64
	ReconcileErrors     float64
	// CPUCores is the CPU the fleet's replicas used in the window, in cores
	// (CPU seconds per second, summed over replicas).
	CPUCores float64
	// ReconcileP99 is from controller_runtime_reconcile_time_seconds over
	// the window, summed over replicas (seconds; -1 without data).
	ReconcileP99 float64
	// QueueWaitP99 is from workqueue_queue_duration_seconds over the window,
	// summed over replicas: how long a request waited for a worker (seconds;
	// -1 without data). With ReconcileP99 it splits end-to-end latency into
	// waiting and working inside the replicas.
	QueueWaitP99 float64
	// Split divides the end-to-end latency of the phase's spec updates at
	// the reconcile that made each Ready (from the audit log; sharded fleets
	// only, nil otherwise).
	Split *LatencySplit `json:",omitempty"`
	// StatusPatchP99 is the API server's p99 of serving a ConfigBinding
	// status patch within the window (apiserver_request_duration_seconds;
	// seconds, -1 without data).
	StatusPatchP99 float64

	// HeapPeakMax and HeapPeakMean are the largest and the mean per-replica
	// peak of go_memstats_heap_inuse_bytes over the fleet's life; RSS the
	// same for resident memory: the larger of process_resident_memory_bytes
	// as sampled and the kernel's high-water mark (VmHWM, on Linux).
	HeapPeakMax, HeapPeakMean, RSSPeakMax, RSSPeakMean float64
	// MemoryLimit is the --memory-limit the fleet's replicas ran with, in
	// bytes; 0 for none (turned off, or a plain fleet, which has no such
	// flag). RSSPeakReplica names the replica of RSSPeakMax.
	MemoryLimit    float64
	RSSPeakReplica string
	// HeapEndMax and HeapEndMean are the same at the end of the measured
	// phase: the steady state, without the warm-up's garbage. Every memory
	// figure is 0 without a sample, which a running process never shows.
	HeapEndMax, HeapEndMean float64
	// HeapPeakSum and HeapEndSum are the whole fleet's: the per-replica
	// peaks summed, and the heaps at the end of the measured phase summed
	// (what the fleet holds at once in the steady state).
	HeapPeakSum, HeapEndSum float64
	// HeapLivePeakMax, HeapLiveEndMax and HeapLiveEndSum are the largest
	// replica's peak and end and the whole fleet's end of the live heap
	// (go_gc_heap_live_bytes, what the last collection marked live): the
	// heap a replica holds, which the heap in use above overstates by the
	// garbage not yet collected at the scrape, a fifth more or less from one
	// scrape to the next. 0 without data (a report from before the load
	// tester read it, or a scrape without the family), and the sum 0
	// unless every replica had it.
	HeapLivePeakMax, HeapLiveEndMax, HeapLiveEndSum float64
	// APIServerRSSPeak and EtcdRSSPeak are the largest resident memory of
	// the control plane's kube-apiserver and etcd over the fleet's life
	// (VmRSS, sampled with the replicas); -1 on a cluster the load tester
	// did not start, whose processes it cannot read.
	APIServerRSSPeak, EtcdRSSPeak float64
	// HeldMax is the most ConfigBindings any replica held (kshard_shard_objects
	// summed), -1 with sharding off, which does not export it, and when no
	// scrape of the fleet had it.
	HeldMax float64
	// The API server's own counts for ConfigBindings over the fleet's life
	// (see apiServerSample): initial syncs (the load tester's own, OwnSyncs,
	// subtracted), objects scanned for them (OwnSyncs × the objects at the
	// fleet's start subtracted: each of them scans every object), bytes sent, and the watches
	// open at the end (the load tester's own one subtracted). APICounted
	// says the API server was read at both ends of the fleet's life; without
	// it these, ScannedPerProcess and the write rates have no data.
	APICounted                         bool
	Syncs, Scanned, Bytes, OpenWatches float64
	OwnSyncs                           int64
	// CachesStarted are the informer caches the fleet's replicas report
	// having started over its life (kshard_caches_started_total, every
	// reason; -1 with sharding off, which does not export it, and when no
	// replica's last scrape had it, as Acquisitions), each one
	// initial sync of ConfigBindings: Syncs beyond it are syncs nobody
	// accounts for. AcquisitionCaches are those started for shards
	// acquired together, of Acquisitions shard Leases acquired: a cache
	// per shard would make them equal.
	CachesStarted, AcquisitionCaches, Acquisitions float64
	// ScannedPerProcess is Scanned divided by the replica processes.
	ScannedPerProcess               float64
	LeaseWritesPerSec, WritesPerSec float64
	// ControllerWrites is the mutating requests on ConfigBindings and
	// ConfigMaps (any subresource) the API server served in the measured
	// phase, less the load tester's own (OwnWrites: its spec-update
	// patches, and creates or deletes where the phase has them);
	// SpecUpdates the spec updates it sent in the phase; and
	// ControllerWritesPerUpdate their ratio, -1 without updates or counts.
	// It is what one spec change costs the API server in the controller's
	// writes (status, ConfigMap), the figure Lease writes and the total
	// hide. WritesCounted says the API server was read at both edges of
	// the phase.
	WritesCounted             bool
	ControllerWrites          float64
	OwnWrites                 int64
	SpecUpdates               int
	ControllerWritesPerUpdate float64

	// Config-center key reads by the replicas in the window and during the
	// rest of the fleet's life (warm-up, settle); change-feed polls. -1
	// without config-center samples in the window or the life.
	CenterGets, CenterGetsOutside, CenterPolls float64
	// CacheHitRatio is (hit+stale)/lookups in the window; -1 without lookups.
	CacheHitRatio float64
	// ReadyFlaps counts objects whose Ready went from True to not True at
	// an unchanged generation during the fleet's life.
	ReadyFlaps int
	// LoadMean and LoadMax are the machine's 1-minute load average in the
	// window: how much else competed for the CPUs; -1 without a sample.
	LoadMean, LoadMax float64
	// Propagation is how fast config-center changes reached the
	// ConfigMaps (with --value-change-interval).
	Propagation PropagationResult
	// Storm is the fleet's create storm: the objects created while it ran,
	// or the ones it found at its start. The report divides its write rate
	// by the calibration's ceiling.
	Storm CreateStorm
	// Labeled is the time until the watch showed the shard label, of the
	// objects first labeled during the fleet's life: from the create, or
	// from the fleet's start for objects created before it.
	Labeled LatencySummary
	// UnlabeledPeak is the largest kshard_unlabeled_objects sampled from
	// any of the fleet's replicas (only the elected labeler sets it): the
	// most objects waiting for a label at once. -1 without a sample, and
	// for a fleet without a labeler (sharding off, the plain controller).
	UnlabeledPeak float64
	// StartOverClaim is, over the replicas that started with the fleet, the
	// largest ratio of the ConfigBindings a replica held while the fleet
	// started to what it held once the start settled (its final share):
	// 1.0 when no replica claimed more than its share on the way. -1 when
	// not measured (sharding off, no objects at the start, or no settle).
	StartOverClaim float64

	PerReplica []ReplicaResult

	// Figures are the Fleets table's rows, and ReplicaFigures the per-replica
	// table's, each a PromQL query against the run's Prometheus
	// (queries/fleets.yaml).
	Figures        []Figure
	ReplicaFigures []ReplicaFigures
}

// ReplicaResult is one replica identity over the fleet's life. Samples
// counts its scrapes: without any, its figures have no data.
type ReplicaResult struct {
	Replica           string
	Processes         int
	Samples           int
	HeapPeak, HeapEnd float64
	// HeapLivePeak and HeapLiveEnd are the live heap's (FleetResult's
	// HeapLive*); 0 without data.
	HeapLivePeak, HeapLiveEnd float64
	RSSPeak, RSSEnd           float64
	ShardsEnd                 float64
	HeldPeak, HeldEnd         float64
	Reconciles                float64
	ExternalCalls             float64
	CacheHitRatio             float64
	HasShardMetrics           bool
}

// fleetResult computes a stopped fleet's numbers from its samples.
func (r *run) fleetResult(f *fleet) *FleetResult {
	label := f.label()
	f.mu.Lock()
	defer f.mu.Unlock()
	args := f.mode.Args
	if !f.mode.Plain {
		args = append(slices.Clone(args), r.opts.ReplicaArgs...)
	}
	res := &FleetResult{Fleet: label, Mode: f.mode.Name, Args: args, Plain: f.mode.Plain, Lifetime: f.stopped.Sub(f.started), HeldMax: -1, CacheHitRatio: -1, ReconcileP99: -1, QueueWaitP99: -1, StatusPatchP99: -1, UnlabeledPeak: -1, StartOverClaim: -1}
	res.Storm = f.storm
	res.Labeled = summarize(r.tracker.labelLatenciesBetween(f.started, f.stopped))
	res.startFigures(f)
	from, to := f.loadFrom, f.loadTo
	if from.IsZero() {
		from, to = f.started, f.stopped
	}
	res.Window = to.Sub(from)
	h := r.tracker.latencies(from, to, writeUpdate)
	res.Updates = summarize(h)
	if s := res.Window.Seconds(); s > 0 {
		res.Throughput = float64(h.Count()) / s
	}
	res.replicaFigures(f, from, to)
	if b, _ := r.opts.memoryLimitBytes(); !f.mode.Plain {
		res.MemoryLimit = float64(b)
	}
	res.APIServerRSSPeak, res.EtcdRSSPeak = r.controlPlanePeak(f.started, f.stopped)
	res.Offered = r.offeredBetween(from, to)
	res.LoadMean, res.LoadMax = r.loadBetween(from, to)
	res.ReadyFlaps = r.tracker.flapsBetween(f.started, f.stopped)
	res.Propagation = f.propagation
	res.apiFigures(f)
	res.SpecUpdates = r.tracker.writesBetween(from, to, writeUpdate)
	res.ControllerWritesPerUpdate = perCause(res.ControllerWrites, res.WritesCounted, res.SpecUpdates)
	res.CenterGets, res.CenterPolls, res.CenterGetsOutside = -1, -1, -1
	inWindow, okWindow := r.centerDelta(from, to)
	life, okLife := r.centerDelta(f.started, f.stopped)
	if okWindow {
		res.CenterGets, res.CenterPolls = inWindow.Gets, inWindow.Polls
		if okLife {
			res.CenterGetsOutside = life.Gets - inWindow.Gets
		}
	}
	return res
}

// startFigures are the fleet's start event's: how long it took to settle,
// and the writes and initial syncs it cost.
func (res *FleetResult) startFigures(f *fleet) {
	res.StartSettled, res.StartError, res.StartObjects = f.startEvent.Reconciled, f.startEvent.Error, f.startObjects
	res.StartWritesCounted, res.StartWrites = f.startEvent.WritesCounted, f.startEvent.ObjectWrites
	res.StartScanned, res.StartSyncs = -1, -1
	res.ShardTableDomains = -1
	if f.mode.Sharded() {
		res.ShardTableDomains = f.tableDomains
	}
	if !f.apiStart.At.IsZero() && !f.startSettledAPI.At.IsZero() && f.startSettledAPI.sameServer(f.apiStart) {
		api := f.startSettledAPI.minus(f.apiStart)
		own := float64(f.startOwnSyncs - f.ownSyncsStart)
		// Each of the load tester's own syncs (its watch relists when the
		// API server drops it as a slow reader) scans every object too.
		res.StartScanned = max(api.Scanned-own*float64(f.startObjects), 0)
		res.StartSyncs = api.Syncs - own
	}
}

// replicaTally gathers what a fleet's figures need of every replica
// process beyond the sums: whether a metric family was ever seen, the
// histograms, and the per-replica memory figures to take the largest and
// the mean of.
type replicaTally struct {
	hits, lookups        float64
	reconcile, queueWait cumulative
	// Whether any scrape of the fleet had the families of objects held,
	// caches started and shards acquired: a sharded fleet that never
	// exported one has no such figure, rather than 0.
	heldSeen, cachesSeen, acquiredSeen bool
	heapPeaks, rssPeaks, heapEnds      []float64
	livePeaks, liveEnds                []float64
}

// replicaFigures sums the fleet's replica processes over its life and its
// measured phase [from, to], a ReplicaResult per replica identity.
func (res *FleetResult) replicaFigures(f *fleet, from, to time.Time) {
	var t replicaTally
	sharded := f.mode.Sharded()
	for _, s := range f.slots {
		if len(s.instances) == 0 {
			continue
		}
		rr := ReplicaResult{Replica: s.id, Processes: len(s.instances), CacheHitRatio: -1, HasShardMetrics: sharded}
		if in := s.instances[0]; sharded && f.startEvent.Error == "" && f.startEvent.Reconciled > 0 && !in.proc.Started().After(f.started.Add(time.Second)) {
			if r, ok := overClaim(in.samples, f.started, f.started.Add(f.startEvent.Reconciled)); ok {
				res.StartOverClaim = math.Max(res.StartOverClaim, r)
			}
		}
		var slotHits, slotLookups float64
		for _, in := range s.instances {
			h, l := res.addInstance(&rr, &t, in, sharded, from, to)
			slotHits, slotLookups = slotHits+h, slotLookups+l
		}
		t.hits, t.lookups = t.hits+slotHits, t.lookups+slotLookups
		if slotLookups > 0 {
			rr.CacheHitRatio = slotHits / slotLookups
		}
		if rr.HasShardMetrics {
			res.HeldMax = math.Max(res.HeldMax, rr.HeldPeak)
		}
		// A replica never scraped has no memory figure: a 0 in the mean
		// would be one.
		res.Samples += rr.Samples
		if rr.Samples > 0 {
			t.heapPeaks = append(t.heapPeaks, rr.HeapPeak)
		}
		if rr.HeapEnd > 0 {
			t.heapEnds = append(t.heapEnds, rr.HeapEnd)
		}
		if rr.HeapLivePeak > 0 {
			t.livePeaks = append(t.livePeaks, rr.HeapLivePeak)
		}
		if rr.HeapLiveEnd > 0 {
			t.liveEnds = append(t.liveEnds, rr.HeapLiveEnd)
		}
		if rr.RSSPeak > 0 {
			t.rssPeaks = append(t.rssPeaks, rr.RSSPeak)
		}
		if rr.RSSPeak > res.RSSPeakMax {
			res.RSSPeakMax, res.RSSPeakReplica = rr.RSSPeak, rr.Replica
		}
		res.PerReplica = append(res.PerReplica, rr)
		res.Replicas++
	}
	res.conclude(&t, sharded)
}

// addInstance adds one process of a replica to its ReplicaResult, the
// fleet's sums and the tally; it returns the process's cache hits and
// lookups in the measured phase [from, to].
func (res *FleetResult) addInstance(rr *ReplicaResult, t *replicaTally, in *instance, sharded bool, from, to time.Time) (hits, lookups float64) {
	res.Processes++
	rr.Samples += len(in.samples)
	for _, x := range in.samples {
		rr.HeapPeak = math.Max(rr.HeapPeak, x.HeapInuse)
		rr.HeapLivePeak = math.Max(rr.HeapLivePeak, x.HeapLive)
		rr.RSSPeak = math.Max(rr.RSSPeak, x.RSS)
		rr.HeldPeak = math.Max(rr.HeldPeak, x.Objects)
		t.heldSeen = t.heldSeen || x.Objects >= 0
		if sharded {
			res.UnlabeledPeak = math.Max(res.UnlabeledPeak, x.Unlabeled)
		}
	}
	rr.RSSPeak = math.Max(rr.RSSPeak, in.peakRSS)
	if n := len(in.samples); n > 0 {
		last := in.samples[n-1]
		rr.Reconciles += last.Reconciles
		rr.ExternalCalls += last.ExternalCalls
		if last.Caches != nil {
			t.cachesSeen = true
			for _, v := range last.Caches {
				res.CachesStarted += v
			}
			res.AcquisitionCaches += last.Caches["acquisition"]
		}
		if last.Acquired >= 0 {
			t.acquiredSeen = true
			res.Acquisitions += last.Acquired
		}
	}
	// "End" is the end of the measured phase: once the fleet is told to
	// stop, leaving replicas hand their shards over. A replica holding no
	// shard exports no series of objects.
	if end, ok := in.at(to); ok && in.proc.Started().Before(to) {
		rr.HeapEnd, rr.RSSEnd, rr.ShardsEnd, rr.HeldEnd = end.HeapInuse, end.RSS, end.Shards, max(end.Objects, 0)
		rr.HeapLiveEnd = max(end.HeapLive, 0)
	}
	res.Reconciles += in.delta(from, to, func(x replicaSample) float64 { return x.Reconciles })
	res.CPUCores += in.delta(from, to, func(x replicaSample) float64 { return x.CPU })
	res.ReconcileErrors += in.delta(from, to, func(x replicaSample) float64 { return x.ReconcileErrors })
	t.reconcile = t.reconcile.add(in.histogramDelta(from, to, func(x replicaSample) cumulative { return x.Reconcile }))
	t.queueWait = t.queueWait.add(in.histogramDelta(from, to, func(x replicaSample) cumulative { return x.QueueWait }))
	hits = in.delta(from, to, func(x replicaSample) float64 { return x.Cache[cacheResultHit] + x.Cache[cacheResultStale] })
	lookups = in.delta(from, to, func(x replicaSample) float64 {
		var sum float64
		for _, v := range x.Cache {
			sum += v
		}
		return sum
	})
	return hits, lookups
}

// conclude turns the replicas' sums into the fleet's figures: families
// never seen to no data, memory to largest, mean and sum, counts over the
// measured phase to rates, histograms to their p99.
func (res *FleetResult) conclude(t *replicaTally, sharded bool) {
	if !sharded || !t.cachesSeen {
		res.CachesStarted, res.AcquisitionCaches = -1, -1
	}
	if !sharded || !t.acquiredSeen {
		res.Acquisitions = -1
	}
	if !t.heldSeen {
		res.HeldMax = -1
	}
	res.HeapPeakMax, res.HeapPeakMean = maxMean(t.heapPeaks)
	_, res.RSSPeakMean = maxMean(t.rssPeaks)
	res.HeapEndMax, res.HeapEndMean = maxMean(t.heapEnds)
	for _, h := range t.heapPeaks {
		res.HeapPeakSum += h
	}
	for _, h := range t.heapEnds {
		res.HeapEndSum += h
	}
	res.HeapLivePeakMax, _ = maxMean(t.livePeaks)
	res.HeapLiveEndMax, _ = maxMean(t.liveEnds)
	if len(t.liveEnds) == len(t.heapEnds) {
		for _, h := range t.liveEnds {
			res.HeapLiveEndSum += h
		}
	}
	if s := res.Window.Seconds(); s > 0 {
		res.Reconciles /= s
		res.CPUCores /= s
	}
	if t.lookups > 0 {
		res.CacheHitRatio = t.hits / t.lookups
	}
	if q, ok := bucketQuantile(0.99, t.reconcile.Bounds, t.reconcile.Counts); ok {
		res.ReconcileP99 = q
	}
	if q, ok := bucketQuantile(0.99, t.queueWait.Bounds, t.queueWait.Counts); ok {
		res.QueueWaitP99 = q
	}
}

// apiFigures are the API server's counts: over the fleet's life (syncs,
// objects scanned, bytes, watches, write rates) and over its measured
// phase (status patches, the controller's writes).
func (res *FleetResult) apiFigures(f *fleet) {
	// A scrape that failed at either end leaves nothing to subtract from
	// or to: its difference would be every count since the server started,
	// or a negative one. So does a restart of the API server in between:
	// its counters started over.
	if res.APICounted = !f.apiStart.At.IsZero() && !f.apiEnd.At.IsZero() && f.apiEnd.sameServer(f.apiStart); res.APICounted {
		api := f.apiEnd.minus(f.apiStart)
		res.OwnSyncs = f.ownSyncsEnd - f.ownSyncsStart
		res.Syncs = api.Syncs - float64(res.OwnSyncs)
		res.Scanned = max(api.Scanned-float64(res.OwnSyncs)*float64(f.startObjects), 0)
		res.Bytes, res.OpenWatches = api.Bytes, max(api.OpenWatches-1, 0)
		if res.Processes > 0 {
			res.ScannedPerProcess = res.Scanned / float64(res.Processes)
		}
		if s := f.apiEnd.At.Sub(f.apiStart.At).Seconds(); s > 0 {
			res.LeaseWritesPerSec = api.LeaseWrites / s
			res.WritesPerSec = api.Writes / s
		}
	}
	if f.loadWritesFrom.spans(f.loadWritesTo) {
		h := f.loadWritesTo.api.StatusPatches.minus(f.loadWritesFrom.api.StatusPatches)
		if q, ok := bucketQuantile(0.99, h.Bounds, h.Counts); ok {
			res.StatusPatchP99 = q
		}
	}
	res.ControllerWrites, res.OwnWrites, res.WritesCounted = controllerWrites(f.loadWritesFrom, f.loadWritesTo)
}

// histogramDelta is the growth of one of the instance's histograms within
// [from, to]: its counts at to less those at from.
func (in *instance) histogramDelta(from, to time.Time, pick func(replicaSample) cumulative) cumulative {
	end, ok := in.at(to)
	if !ok {
		return cumulative{}
	}
	h := pick(end)
	counts := append([]float64(nil), h.Counts...)
	if start, ok := in.at(from); ok {
		if s := pick(start); len(s.Counts) == len(counts) {
			for i := range counts {
				counts[i] -= s.Counts[i]
			}
		}
	}
	return cumulative{Bounds: h.Bounds, Counts: counts}
}

// add sums two histograms with the same bounds; an empty one is the
// identity.
func (h cumulative) add(o cumulative) cumulative {
	if len(h.Bounds) == 0 {
		return cumulative{Bounds: o.Bounds, Counts: append([]float64(nil), o.Counts...)}
	}
	if len(o.Bounds) != len(h.Bounds) {
		return h
	}
	for i := range h.Counts {
		h.Counts[i] += o.Counts[i]
	}
	return h
}

// maxMean is the largest and the mean of v; 0 and 0 for none.
func maxMean(v []float64) (mx, mean float64) {
	if len(v) == 0 {
		return 0, 0
	}
	for _, x := range v {
		mx = math.Max(mx, x)
		mean += x
	}
	return mx, mean / float64(len(v))
}

// loadBetween is the mean and the largest 1-minute load average sampled
// within [from, to]; -1 and -1 without a sample.
func (r *run) loadBetween(from, to time.Time) (mean, peak float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range r.loads {
		if l.At.Before(from) || l.At.After(to) {
			continue
		}
		n++
		mean += l.Load
		peak = math.Max(peak, l.Load)
	}
	if n == 0 {
		return -1, -1
	}
	return mean / float64(n), peak
}

// centerDelta is the config center's growth in [from, to], from the
// samples nearest inside the interval; false without a sample there.
func (r *run) centerDelta(from, to time.Time) (centerSample, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first, last *centerSample
	for i := range r.center {
		s := &r.center[i]
		if s.At.Before(from) || s.At.After(to) {
			continue
		}
		if first == nil {
			first = s
		}
		last = s
	}
	if first == nil {
		return centerSample{}, false
	}
	return centerSample{Gets: last.Gets - first.Gets, Polls: last.Polls - first.Polls}, true
}

// offeredBetween is the update rate the generator aimed at in a window.
func (r *run) offeredBetween(from, to time.Time) float64 {
	if to.Sub(from) <= 0 {
		return 0
	}
	return float64(r.tracker.writesBetween(from, to, writeUpdate)) / to.Sub(from).Seconds()
}

// newReport starts the run's report: what it is, where it runs, and its
// settings in words.
func (r *run) newReport(ctx context.Context) *Report {
	o := r.opts
	src, err := readSource(ctx)
	if err != nil {
		r.log.Error(err, "Reading the commit of the source tree; the report says commit: unknown")
	}
	rep := &Report{
		Source:      src,
		Scenario:    o.Scenario,
		Description: r.sc.doc,
		Command:     o.Command,
		Started:     time.Now(),
		Gated:       r.sc.gate,
		Machine: Machine{
			CPUs: runtime.NumCPU(), CPUModel: cpuModel(), GoVersion: runtime.Version(),
			OS: runtime.GOOS + "/" + runtime.GOARCH, KubeAPIServer: r.serverVersion,
			Calibration: r.calibration,
		},
	}
	if t := r.pods; t != nil {
		rep.Machine.Pods = fmt.Sprintf("the pods of StatefulSet %s/%s", t.namespace, t.name)
	}
	rep.Settings = r.settings()
	return rep
}

// settings is the report's settings table, in order.
func (r *run) settings() [][2]string {
	o := r.opts
	var out [][2]string
	set := func(k, v string) { out = append(out, [2]string{k, v}) }
	set("objects", fmt.Sprintf("%d ConfigBindings over %d domains (%s), %d of %d keys each", o.Objects, o.Domains, skewText(o), o.KeysPerObject, o.KeysPerDomain))
	set("load", r.loadSetting())
	r.replicaSettings(set)
	set("API server write ceiling (calibration)", ceilingText(r.calibration))
	switch {
	case r.apiAuditLog == "":
		set("API server audit log", "none (a cluster of --kubeconfig without --apiserver-audit-log): the write check has no data")
	case r.opts.Kubeconfig == "":
		set("API server audit log", "written by the run's control plane under internal/audit's policy (writes to Leases, ConfigMaps, ConfigBindings, ExternalDomains, with the objects; blocking mode), read by the write check")
	default:
		set("API server audit log", r.apiAuditLog+", read by the write check")
	}
	set("leases", fmt.Sprintf("duration %s, renew deadline %s, retry period %s; %d shards", o.LeaseDuration, o.RenewDeadline, o.RetryPeriod, o.Shards))
	if o.OutageFor > 0 {
		set("outage", fmt.Sprintf("config center answers 503 from %s into the measured phase, for %s", o.OutageAfter, o.OutageFor))
	}
	if r.sc.faults {
		var rotation []string
		for _, k := range r.chaos {
			rotation = append(rotation, r.faultText(k))
		}
		set("chaos", fmt.Sprintf("a fault on a random replica every %s (from the settle after the last one), in rotation: %s", o.ChaosInterval, strings.Join(rotation, ", ")))
	}
	if m, _ := o.replicaMillicores(); m > 0 {
		set("replica CPU", fmt.Sprintf("%s per replica process: a cgroup of its own (cgroup v1 CFS), quota %s per %s period, entered before the replica binary runs", o.ReplicaCPU, time.Duration(m)*cpuQuotaPeriod/1000, cpuQuotaPeriod))
	}
	if r.pods != nil {
		set("memory limit", o.MemoryLimit+" per replica, the container's limit")
	} else {
		set("memory limit", memorySetting(o))
	}
	return out
}

// loadSetting says what load the run put on the replicas.
func (r *run) loadSetting() string {
	o := r.opts
	switch {
	case r.sc.name == "capacity":
		return fmt.Sprintf("creates at %g/s; spec updates to random objects in windows of %s, the first fleet's first at %g/s (--update-rate × objects), a later fleet's first at %.1f × its replicas × the first fleet's capacity per replica", o.CreateRate, o.Duration, o.UpdateRate*float64(o.Objects), capacityStartShare)
	case r.sc.noLoad:
		return fmt.Sprintf("creates at %g/s; no continuous updates: the scenario's storms are the load", o.CreateRate)
	}
	return fmt.Sprintf("creates at %g/s; spec updates at %g per object per second (%g/s in all) for %s per measured phase", o.CreateRate, o.UpdateRate, float64(o.Objects)*o.UpdateRate, o.Duration)
}

// replicaSettings say what the replicas and the config center were: a
// StatefulSet's pods and the cluster's config center, or the load
// tester's processes with its identity for each.
func (r *run) replicaSettings(set func(k, v string)) {
	o := r.opts
	if t := r.pods; t != nil {
		set("replicas", fmt.Sprintf("%d pods of StatefulSet %s/%s (image %s, ring %s), scaled and deleted through the API server; "+
			"audit records from the container logs, metrics over HTTPS with the load tester's ServiceAccount token", o.Replicas, t.namespace, t.name, t.image, t.ring))
		set("config center", fmt.Sprintf("the cluster's (Service %s/%s at %s), seeded and given its faults through its admin API: %d-byte values, %s latency + up to %s jitter, %g error rate",
			t.namespace, centerService, r.centerURL, o.ValueBytes, o.Latency, o.Jitter, o.ErrorRate))
		return
	}
	set("replicas", fmt.Sprintf("%d (scenario-specific fleets below)", o.Replicas))
	if fe := r.fencing; fe != nil {
		policy := "deploy/base's " + audit.FencingPolicy + " admission policy, which refuses a shard write by a pod not holding the shard's Lease"
		if !fe.enforced {
			policy = "the " + audit.FencingPolicy + " admission policy NOT bound (--no-fencing): the API server refuses no late write"
		}
		set("replica identity", "sharded replicas: a token of deploy/base's ServiceAccount bound to a Pod object of the replica's name (created, never run), deploy/base's RBAC, "+
			policy+"; sharding off and the plain controller: the load tester's admin credentials")
	}
	set("config center", fmt.Sprintf("%d-byte values, %s latency + up to %s jitter, %g error rate", o.ValueBytes, o.Latency, o.Jitter, o.ErrorRate))
}

// faultText says what a fault of the kind does, on pods or on the load
// tester's processes.
func (r *run) faultText(k faultKind) string {
	o := r.opts
	if r.pods != nil {
		return map[faultKind]string{
			faultForceDelete:      "forced pod deletion (grace 0, as kubectl delete pod --grace-period=0 --force: the kubelet still sends SIGTERM with 2 s to go; the StatefulSet recreates the pod at once)",
			faultDelete:           "pod deletion with its grace period (the StatefulSet recreates the pod at once)",
			faultDelay:            fmt.Sprintf("delay (what the pod sends to the API server dropped for %s in its network namespace, then sent again by TCP: %s)", o.DelayFor, o.NodeFaults),
			faultPartition:        fmt.Sprintf("partition (the pod's veth down for %s, then up: %s)", o.DelayFor, o.NodeFaults),
			faultAPIServerRestart: fmt.Sprintf("API server restart (SIGTERM, then the same command line: %s)", o.NodeFaults),
		}[k]
	}
	return map[faultKind]string{
		faultKill:             fmt.Sprintf("kill (SIGKILL, restarted after %s)", o.RestartDelay),
		faultPause:            fmt.Sprintf("pause (SIGSTOP for %s, then SIGCONT)", o.PauseFor),
		faultClock:            fmt.Sprintf("clock offset (SIGTERM, restarted with --lease-clock-offset %s, then %s, in turn, kept until another fault restarts it)", signed(o.ClockOffset), signed(-o.ClockOffset)),
		faultDelay:            fmt.Sprintf("delay (what it sends to the API server held for %s by a proxy on its connection, then delivered)", o.DelayFor),
		faultPartition:        fmt.Sprintf("partition (both ways of its connection to the API server held for %s by the proxy, then delivered)", o.DelayFor),
		faultAPIServerRestart: "API server restart (SIGTERM, then the same command line, port and certificates)",
	}[k]
}

// memorySetting says what --memory-limit the replicas got.
func memorySetting(o Options) string {
	if b, _ := o.memoryLimitBytes(); b <= 0 {
		return "none (--memory-limit 0)"
	}
	limit := fmt.Sprintf("%s per kshard replica (--memory-limit: Go soft limit 90 %%, external cache a quarter)", o.MemoryLimit)
	if o.MemoryLimit == DefaultMemoryLimit {
		limit += ", deploy/base's"
	}
	return limit
}

func skewText(o Options) string {
	if o.Skew == SkewZipf {
		return fmt.Sprintf("Zipf, s=%g", o.ZipfS)
	}
	return "uniform"
}

// cpuModel reads the CPU model on Linux; elsewhere it is unknown.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}

// finish runs the checks every scenario reports, after the last fleet
// stopped.
func (r *run) finish(runErr error) {
	rep := r.report
	rep.Wall = time.Since(rep.Started)
	rep.Machine.LoadMean, rep.Machine.LoadMax = r.loadBetween(r.begin, time.Now())
	updates := &histogram{}
	sharded := false
	for _, f := range r.fleets {
		if f.result != nil {
			rep.Fleets = append(rep.Fleets, f.result)
		}
		if !f.loadFrom.IsZero() {
			updates.Merge(r.tracker.latencies(f.loadFrom, f.loadTo, writeUpdate))
		}
		sharded = sharded || f.mode.Sharded()
	}
	creates := r.tracker.latencies(r.begin, time.Now(), writeCreate)
	rep.Updates, rep.Creates, rep.Labeled = summarize(updates), summarize(creates), summarize(r.tracker.labelLatencies())

	// 1. Writes outside a tenure, from the API server's audit log; 2.
	// overlapping reconciles, from every replica process's audit log.
	r.auditChecks(sharded)
	// 3. Every object's latest generation Ready after the final settle.
	rep.Checks = append(rep.Checks, readyCheck(r.tracker.notReady()))
	// 4. No shard unowned beyond lease duration + retry period.
	bound := r.opts.LeaseDuration + r.opts.RetryPeriod
	if !sharded {
		rep.Checks = append(rep.Checks, notApplicableCheck("no shard unowned beyond "+bound.String(), "no sharded fleet"))
	} else {
		r.mu.Lock()
		outages := slices.Clone(r.restarts)
		r.mu.Unlock()
		rep.Checks = append(rep.Checks, unownedCheck(r.ring.unownedIntervals(), r.ring.guardedTicks(), bound, r.begin, outages))
	}
	// 5. Every event settled.
	rep.Checks = append(rep.Checks, eventsCheck(rep.Events, r.opts.SettleTimeout))
	// 6. No replica's resident memory beyond its memory limit; on pods, no
	// container restarted or OOM-killed.
	var restarts *containerRestarts
	if r.pods != nil {
		n, rs := r.pods.restarts(r.begin)
		restarts = &containerRestarts{pods: n, restarts: rs}
	}
	rep.Checks = append(rep.Checks, memoryCheck(rep.Fleets, restarts))

	rep.Passed = runErr == nil
	for _, c := range rep.Checks {
		rep.Passed = rep.Passed && c.Passed
	}
	if runErr != nil {
		rep.Error = runErr.Error()
	}
	r.addNotes()
	sort.SliceStable(rep.Events, func(i, j int) bool { return rep.Events[i].At < rep.Events[j].At })
}

// auditChecks add the checks from the audit logs: no write outside its
// writer's tenure (the API server's), no overlapping reconciles (every
// replica process's). A plain fleet has no audit log, so its reconciles
// are not checked; one active replica holds no shard Lease, so its writes
// are not.
func (r *run) auditChecks(sharded bool) {
	rep := r.report
	var files []auditFile
	var plain, single []string
	pauses := map[string][]window{}
	for _, f := range r.fleets {
		files = append(files, f.auditFiles()...)
		switch {
		case f.mode.Plain:
			plain = append(plain, f.label())
		case !f.mode.Sharded():
			single = append(single, f.label())
		}
		for id, ws := range f.pauseWindows() {
			pauses[id] = append(pauses[id], ws...)
		}
	}
	notAudited, notChecked := "", ""
	if len(plain) > 0 {
		notAudited = fmt.Sprintf("; not checked for %s: no kshard code, no audit log (one active replica)", strings.Join(plain, ", "))
	}
	if unsharded := append(single, plain...); len(unsharded) > 0 {
		notChecked = fmt.Sprintf("; not checked for %s: one active replica, no shard Lease", strings.Join(unsharded, ", "))
	}
	if !sharded {
		na := "no sharded fleet (one active replica)"
		rep.Checks = append(rep.Checks, notApplicableCheck(checkWrites, na+notChecked), notApplicableCheck(checkReconciles, na+notAudited))
		return
	}
	rep.Writes = writeEvidence(r.evidence())
	rep.Checks = append(rep.Checks, rep.Writes.check(notChecked))
	if c, ok := rep.Writes.relistCheck(); ok {
		rep.Checks = append(rep.Checks, c)
	}
	for _, d := range rep.Writes.Delays {
		rep.Findings = append(rep.Findings, d.String())
	}
	data, err := readAudit(files, time.Now())
	if err != nil {
		rep.Checks = append(rep.Checks, noDataCheck(checkReconciles, err.Error()+notAudited))
		return
	}
	rep.Audit = auditSummary(data, len(files), audit.Overlaps(data.ByObject), pauses, r.opts.RetryPeriod)
	for _, f := range r.fleets {
		if f.result != nil && f.mode.Sharded() && !f.loadFrom.IsZero() {
			f.result.Split = splitLatencies(r.tracker.samplesBetween(f.loadFrom, f.loadTo, writeUpdate), data.ByObject)
		}
	}
	rep.Checks = append(rep.Checks, rep.Audit.reconcileCheck(notAudited))
}

// addNotes notes what makes some of the report's figures partial: the
// load tester's own failed writes, an API server restart during a fleet.
func (r *run) addNotes() {
	rep := r.report
	st := &r.gen.stats
	if e := st.errors.Load(); e > 0 {
		last, _ := st.lastErr.Load().(string)
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d of the load tester's writes failed (not retried, not counted as latency); the last: %s", e, last))
	}
	for _, f := range r.fleets {
		if !f.apiStart.At.IsZero() && !f.apiEnd.At.IsZero() && !f.apiEnd.sameServer(f.apiStart) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("The API server restarted while %s ran: its counters started over, so the fleet's counts from its /metrics (syncs, objects scanned, bytes, writes) are given as no data.", f.label()))
		}
	}
}

// readyCheck passes when every object tracked is Ready at its latest
// generation (n of total are not; ex are examples); without objects it has
// no data.
func readyCheck(n, total int, ex []string) Check {
	const name = "every latest generation became Ready"
	if total == 0 {
		return noDataCheck(name, "the run tracked no object")
	}
	c := Check{Name: name, Passed: n == 0, Detail: fmt.Sprintf("%d of %d objects Ready at their latest generation", total-n, total)}
	if n > 0 {
		c.Detail += "; e.g. " + strings.Join(ex, "; ")
	}
	return c
}

// unownedCheck passes when no unowned interval of a shard (iv, longest
// first) lasted beyond bound. ticks counts the ring watch's checks of
// ownership while a sharded fleet ran: without any, "no interval" would
// say nothing, so the check has no data. While the API server is away
// (outages) no Lease can be renewed or taken: an interval that overlaps an
// outage is excused when it ended within bound after the server answered
// again.
func unownedCheck(iv []unownedInterval, ticks int, bound time.Duration, begin time.Time, outages []apiServerRestart) Check {
	name := fmt.Sprintf("no shard unowned beyond lease duration + retry period (%s)", bound)
	switch {
	case ticks == 0:
		return noDataCheck(name, "the ring watch never checked the shards' ownership while a sharded fleet ran")
	case len(iv) == 0:
		return Check{Name: name, Passed: true, Detail: fmt.Sprintf("no shard was ever without a running holder while the fleets ran (%d checks of every shard)", ticks)}
	}
	longest := iv[0]
	over, excused := 0, 0
	for _, x := range iv {
		if x.To.Sub(x.From) <= bound {
			continue
		}
		outage := false
		for _, o := range outages {
			if x.From.Before(o.Ready) && !x.To.After(o.At) {
				continue
			}
			if x.From.Before(o.Ready) && !x.To.After(o.Ready.Add(bound)) {
				outage = true
			}
		}
		if outage {
			excused++
		} else {
			over++
		}
	}
	c := Check{Name: name, Passed: over == 0, Detail: fmt.Sprintf("%d unowned intervals; the longest: shard %d for %s (from %s into the run)",
		len(iv), longest.Shard, round(longest.To.Sub(longest.From)), round(longest.From.Sub(begin)))}
	if over > 0 {
		c.Detail += fmt.Sprintf("; %d beyond the bound", over)
	}
	if excused > 0 {
		c.Detail += fmt.Sprintf("; %d longer across an API server restart, each held again within the bound after the server answered again (not a failure: no Lease can be renewed or taken while it is away)", excused)
	}
	return c
}

// eventsCheck passes when every event settled within the settle timeout.
// Every fleet's start is an event, so a run without events has no data.
func eventsCheck(events []EventResult, timeout time.Duration) Check {
	name := "every event settled within " + timeout.String()
	if len(events) == 0 {
		return noDataCheck(name, "no event was recorded, not even a fleet's start")
	}
	var unsettled []string
	for _, ev := range events {
		if ev.Error != "" {
			unsettled = append(unsettled, ev.Name+": "+ev.Error)
		}
	}
	return Check{Name: name, Passed: len(unsettled) == 0, Detail: fmt.Sprintf("%d events", len(events)) + strings.Join(append([]string{""}, unsettled...), "; ")}
}

// containerRestarts is what the pod watch saw of the replicas' containers
// on a StatefulSet's pods: how many pods, and which of their containers
// restarted or were OOM-killed during the run.
type containerRestarts struct {
	pods     int
	restarts []podRestart
}

// memoryCheck passes when no replica's peak resident memory reached the
// memory limit it ran with: in a container with that limit (deploy/base's),
// the kernel would have killed it. A fleet with a limit but no resident
// memory measured has no data, which fails it. On pods (pods not nil) the
// kernel's kill is seen as it happens: a container that restarted or was
// OOM-killed fails it too, named, since between two scrapes a peak can
// pass unseen and the restarted process reports only its own memory.
func memoryCheck(fleets []*FleetResult, pods *containerRestarts) Check {
	name := "peak resident memory below the memory limit"
	if pods != nil {
		name += ", no replica container restarted or OOM-killed"
	}
	var worst *FleetResult
	var unmeasured []string
	passed := true
	for _, f := range fleets {
		switch {
		case f.MemoryLimit <= 0:
			continue
		case f.RSSPeakMax <= 0:
			unmeasured = append(unmeasured, f.Fleet)
			continue
		}
		if worst == nil || f.RSSPeakMax/f.MemoryLimit > worst.RSSPeakMax/worst.MemoryLimit {
			worst = f
		}
		passed = passed && f.RSSPeakMax < f.MemoryLimit
	}
	noLimit := "no replica ran with a memory limit (--memory-limit 0, or the plain controller, which has none)"
	var c Check
	switch {
	case len(unmeasured) > 0:
		c = noDataCheck(name, "no resident memory measured of "+strings.Join(unmeasured, ", "))
	case worst == nil && pods == nil:
		return notApplicableCheck(name, noLimit)
	case worst == nil:
		c = Check{Name: name, Passed: true, Detail: noLimit}
	default:
		c = Check{Name: name, Passed: passed}
	}
	var parts []string
	if c.Detail != "" {
		parts = append(parts, c.Detail)
	}
	if worst != nil {
		parts = append(parts, fmt.Sprintf("largest: %s of %s, %s (%s) of its %s limit", worst.RSSPeakReplica, worst.Fleet, formatBytes(worst.RSSPeakMax),
			perCauseText(worst.RSSPeakMax/worst.MemoryLimit, "n/a"), formatBytes(worst.MemoryLimit)))
	}
	switch {
	case pods == nil:
	case len(pods.restarts) > 0:
		c.Passed = false
		var rs []string
		for _, r := range pods.restarts {
			rs = append(rs, r.String())
		}
		parts = append(parts, "RESTARTED: "+strings.Join(rs, "; "))
	case pods.pods == 0:
		c.Passed, c.NoData = false, true
		parts = append(parts, "no data: the pod watch saw no replica pod, so no restart or OOM kill was checked")
	default:
		parts = append(parts, fmt.Sprintf("no container of the %d replica pods seen restarted or was OOM-killed", pods.pods))
	}
	c.Detail = strings.Join(parts, "; ")
	return c
}

// overClaim is the most objects a replica held between from and to (its
// samples in that window) divided by what it held at to; false when it held
// nothing at to.
func overClaim(samples []replicaSample, from, to time.Time) (float64, bool) {
	var peak, end float64
	for _, x := range samples {
		if x.At.Before(from) || x.At.After(to) {
			continue
		}
		peak = math.Max(peak, x.Objects)
		end = x.Objects
	}
	if end <= 0 {
		return 0, false
	}
	return peak / end, true
}
