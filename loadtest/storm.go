package loadtest

import (
	"context"
	"fmt"
	"time"
)

// Kinds of create storm.
const (
	// stormCreates: the objects were created while the fleet ran, paced by
	// the create rate (basic, scale-out, chaos, rolling-restart,
	// resync-storm, external-outage).
	stormCreates = "creates"
	// stormStart: the objects existed before the fleet started, so its start
	// reconciled all of them at once (compare-sharding, compare-external,
	// handover).
	stormStart = "start"
	// stormRamp: autoscale's objects were created at a paced ramp while the
	// HPA scaled the fleet, and nothing waited for them to be Ready.
	stormRamp = "ramp"
)

// writesPerCreate is what the first reconcile of a created object costs the
// API server when nothing is in the way: the elected labeler's label patch,
// the ConfigMap's server-side apply and the status patch. It converts the
// ceiling from writes per second into created objects per second for
// people; the fleet tables show the measured writes per object instead.
const writesPerCreate = 3

// CreateStorm is the burst of first reconciles a fleet met, whichever way
// the scenario makes it, so every fleet has one throughput figure against
// the API server's ceiling: objects created while it runs, or objects that
// existed when it started.
type CreateStorm struct {
	// Kind is stormCreates, stormStart or stormRamp; empty for a fleet that
	// met none (a comparison fleet after the objects were deleted, say).
	Kind string
	// Began is the first create, or the fleet's first process.
	Began time.Time
	// Objects is the objects in the storm; CreateRate the creates per
	// second the load tester aimed at (stormCreates, stormRamp).
	Objects    int
	CreateRate float64
	// Duration is from the first create (or the fleet's first process) until
	// every object was Ready at its latest generation (stormCreates: the
	// creation event's settle; stormStart: the start event's), or, for
	// stormRamp, until the last create was answered. Settled says it ended
	// with every object Ready; false for a ramp or a settle that timed out.
	Duration time.Duration
	Settled  bool
	// WritesCounted says the API server was read at both ends. Writes is
	// then its mutating requests on ConfigBindings and ConfigMaps (any
	// subresource, every code) in the storm, less the load tester's own
	// (Own: its creates): the labeler's label patches and the replicas'
	// ConfigMap applies and status patches.
	WritesCounted bool
	Writes        float64
	Own           int64
	// ServerCPUPerWrite is the kube-apiserver's CPU per controller write in
	// the storm, in seconds: its cores between the samples inside the storm
	// over the storm's controller writes per second. It takes in all the
	// server did meanwhile (watch events, Lease renewals, admission, the
	// audit log), so fleets compare by what each write costs the server
	// with them, a count where the write rate is a time. 0 without samples
	// of a control plane the load tester started, or without writes.
	ServerCPUPerWrite float64 `json:",omitempty"`
}

// stormFigures are a storm's rates; -1 where there is no figure.
type stormFigures struct {
	// ReadyPerSec is Objects per second of Duration, for a settled storm.
	ReadyPerSec float64
	// WritesPerObject is Writes per object of the storm.
	WritesPerObject float64
	// WritesPerSec is Writes per second of Duration.
	WritesPerSec float64
	// OfCeiling is WritesPerSec ÷ the ceiling's writes per second.
	OfCeiling float64
}

// figures computes the storm's rates against a ceiling in writes per second
// (≤ 0: not measured).
func (s CreateStorm) figures(ceiling float64) stormFigures {
	f := stormFigures{ReadyPerSec: -1, WritesPerObject: -1, WritesPerSec: -1, OfCeiling: -1}
	if s.Kind == "" || s.Objects <= 0 || s.Duration <= 0 {
		return f
	}
	secs := s.Duration.Seconds()
	if s.Settled {
		f.ReadyPerSec = float64(s.Objects) / secs
	}
	if !s.WritesCounted {
		return f
	}
	f.WritesPerObject = s.Writes / float64(s.Objects)
	f.WritesPerSec = s.Writes / secs
	if ceiling > 0 {
		f.OfCeiling = f.WritesPerSec / ceiling
	}
	return f
}

// describe says what the storm was, for the fleet table.
func (s CreateStorm) describe() string {
	switch s.Kind {
	case stormCreates:
		return fmt.Sprintf("%d creates at %g/s", s.Objects, s.CreateRate)
	case stormStart:
		return fmt.Sprintf("fleet start on %d new objects", s.Objects)
	case stormRamp:
		return fmt.Sprintf("%d creates at %.3g/s under the HPA (Ready not awaited)", s.Objects, s.CreateRate)
	}
	return "none"
}

// stormOfStart is the create storm of a fleet that started on existing
// objects: its start event.
func stormOfStart(ev EventResult, began time.Time, objects int) CreateStorm {
	if objects == 0 {
		return CreateStorm{}
	}
	return CreateStorm{
		Kind: stormStart, Began: began, Objects: objects, Duration: ev.Reconciled, Settled: ev.Error == "",
		WritesCounted: ev.WritesCounted, Writes: ev.ObjectWrites, Own: ev.OwnWrites,
	}
}

// measureStorm times a create storm from at, right before create, until
// create returns, and counts the object writes in between. Callers run no other
// writes of the load tester meanwhile but the creates (their own writes are
// subtracted anyway).
func (r *run) measureStorm(ctx context.Context, kind string, objects int, perSecond float64, create func(at time.Time) (settled bool, err error)) (CreateStorm, error) {
	r.scraped(ctx)
	before := r.markWritesOrLog(ctx)
	at := time.Now()
	settled, err := create(at)
	s := CreateStorm{Kind: kind, Began: at, Objects: objects, CreateRate: perSecond, Duration: time.Since(at), Settled: settled}
	if writes, own, ok := controllerWrites(before, r.markWritesOrLog(ctx)); ok {
		s.WritesCounted, s.Writes, s.Own = true, writes, own
	}
	return r.withServerCPU(s, at), err
}

// withServerCPU adds the API server's CPU per controller write to a storm
// that began at at.
func (r *run) withServerCPU(s CreateStorm, at time.Time) CreateStorm {
	if api, _, ok := r.controlPlaneCores(at, at.Add(s.Duration)); ok && s.WritesCounted && s.Writes > 0 && s.Duration > 0 {
		s.ServerCPUPerWrite = api / (s.Writes / s.Duration.Seconds())
	}
	return s
}

// ceilingText is the calibration for the report's settings.
func ceilingText(c *Calibration) string {
	switch {
	case c == nil:
		return "not measured (--calibrate-for 0): the ceiling rows say n/a"
	case !c.measured():
		return "not measured: " + c.Error
	}
	return fmt.Sprintf("%.0f writes/s: merge patches of ConfigBinding status from %d workers with no client-side rate limit, "+
		"for %s on %d throwaway ConfigBindings before the first fleet (%d patches in %s, %d errors; p50 %s, p99 %s per patch). "+
		"At %d writes per created object (label patch, ConfigMap apply, status patch) that is %.0f created objects/s",
		c.WritesPerSec, c.Workers, c.Duration, c.Objects, c.Patches, round(c.Elapsed), c.Errors, fmtDur(c.P50), fmtDur(c.P99),
		writesPerCreate, c.WritesPerSec/writesPerCreate)
}
