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
	// Kind is stormCreates or stormStart; empty for a fleet that
	// met none (a comparison fleet after the objects were deleted, say).
	Kind string
	// Began is the first create, or the fleet's first process.
	Began time.Time
	// Objects is the objects in the storm; CreateRate the creates per
	// second the load tester aimed at (stormCreates).
	Objects    int
	CreateRate float64
	// Duration is from the first create (or the fleet's first process) until
	// every object was Ready at its latest generation (stormCreates: the
	// creation event's settle; stormStart: the start event's). Settled says
	// it ended with every object Ready; false for a settle that timed out.
	Duration time.Duration
	Settled  bool
}

// describe says what the storm was, for the fleet table.
func (s CreateStorm) describe() string {
	switch s.Kind {
	case stormCreates:
		return fmt.Sprintf("%d creates at %g/s", s.Objects, s.CreateRate)
	case stormStart:
		return fmt.Sprintf("fleet start on %d new objects", s.Objects)
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
	}
}

// measureStorm times a create storm from at, right before create, until
// create returns. Its writes are the storm queries' (queries/fleets.yaml),
// counted from a scrape of the quiet before it. Callers run no other
// writes of the load tester meanwhile but the creates (their own writes are
// subtracted anyway).
func (r *run) measureStorm(ctx context.Context, kind string, objects int, perSecond float64, create func(at time.Time) (settled bool, err error)) (CreateStorm, error) {
	at := r.spanStart(ctx)
	settled, err := create(at)
	return CreateStorm{Kind: kind, Began: at, Objects: objects, CreateRate: perSecond, Duration: time.Since(at), Settled: settled}, err
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
