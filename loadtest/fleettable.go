package loadtest

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// fleetRow is one row of the report's fleets table: its title, and how a
// fleet's cell reads from the fleet's result. The rows are data, so a
// figure is one line here and the table renders them all alike.
type fleetRow struct {
	title string
	cell  func(*FleetResult) string
}

// renderFleets writes the fleets side by side: one column per fleet, one
// row per fleetRows entry, then a row per replica.
func renderFleets(b *strings.Builder, rep *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	fl := rep.Fleets
	p("\n## Fleets\n\nOne column per fleet, run one after another on the same control plane, objects and load. " +
		"Latency, throughput, reconciles, config-center calls and cache hits are over each fleet's measured phase; " +
		"memory, LISTs and Lease writes over its whole life (start, warm-up, load, settle).\n\n|  |")
	for _, f := range fl {
		p(" %s |", mdEscape(f.Fleet))
	}
	p("\n| --- |%s\n", strings.Repeat(" ---: |", len(fl)))
	for _, row := range fleetRows(rep) {
		p("| %s |", row.title)
		for _, f := range fl {
			p(" %s |", row.cell(f))
		}
		p("\n")
	}
	renderReplicas(b, fl)
	for _, f := range fl {
		if f.OwnSyncs > 0 {
			p("\nThe load tester's own initial syncs of ConfigBindings (%d during %s: its watch resyncing) are subtracted from the sync counts above, not from the scanned objects and bytes.\n", f.OwnSyncs, mdEscape(f.Fleet))
		}
	}
}

// fleetRows are the fleets table's rows, in order; a section about
// something no fleet had (no objects at a start, no storm, no probes) is
// left out.
func fleetRows(rep *Report) []fleetRow {
	fl := rep.Fleets
	has := func(pred func(*FleetResult) bool) bool { return slices.ContainsFunc(fl, pred) }
	rows := slices.Concat(identityRows(rep.Machine.CPUs), memoryRows(fl))
	if has(func(f *FleetResult) bool { return f.StartObjects > 0 }) {
		rows = append(rows, startRows(fl)...)
	}
	if has(func(f *FleetResult) bool { return f.Storm.Kind != "" }) {
		rows = append(rows, stormRows(rep.Machine.Calibration)...)
	}
	if has(func(f *FleetResult) bool { return f.Storm.ServerCPUPerWrite > 0 }) {
		rows = append(rows, fleetRow{"create storm: kube-apiserver CPU per controller write (all it served meanwhile)", func(f *FleetResult) string {
			if f.Storm.ServerCPUPerWrite <= 0 {
				return noData
			}
			return fmt.Sprintf("%.2f ms", f.Storm.ServerCPUPerWrite*1000)
		}})
	}
	rows = slices.Concat(rows, shardRows(), syncRows(fl), phaseRows())
	if has(func(f *FleetResult) bool { return f.Propagation.Probes > 0 }) {
		rows = append(rows, propagationRows()...)
	}
	return append(rows, writeRows()...)
}

// identityRows say what each fleet ran: its flags, processes, measured
// phase and the machine's load meanwhile.
func identityRows(cpus int) []fleetRow {
	return []fleetRow{
		{"controller flags", func(f *FleetResult) string {
			switch {
			case f.Plain && len(f.Args) == 0:
				return "`plaincontroller` (no kshard code)"
			case f.Plain:
				return "`plaincontroller` (no kshard code) " + code(f.Args)
			}
			return code(f.Args)
		}},
		{"replica processes (restarts included)", func(f *FleetResult) string { return fmt.Sprint(f.Processes) }},
		{"measured phase", func(f *FleetResult) string { return fmtDur(f.Window) }},
		{fmt.Sprintf("machine load average in the phase, mean / peak (%d CPUs)", cpus), func(f *FleetResult) string {
			if f.LoadMax < 0 {
				return noData
			}
			return fmt.Sprintf("%.1f / %.1f", f.LoadMean, f.LoadMax)
		}},
	}
}

// memoryRows are the fleets' memory figures. Heap is compared with the
// plain controller-runtime fleet, the floor, where the run has one; else
// with the first fleet; with one fleet, not at all.
func memoryRows(fl []*FleetResult) []fleetRow {
	base := fl[0]
	if plain := plainFleet(fl); plain != nil {
		base = plain
	}
	field := func(v func(*FleetResult) float64) func(*FleetResult) string {
		return func(f *FleetResult) string { return memoryText(v(f)) }
	}
	var rows []fleetRow
	figures := []memoryFigure{
		{title: "heap in use per replica, peak (largest)", v: func(f *FleetResult) float64 { return f.HeapPeakMax }},
		{title: "heap in use per replica, peak (mean)", v: func(f *FleetResult) float64 { return f.HeapPeakMean }},
		{title: "largest peak heap ÷ %s's", v: func(f *FleetResult) float64 { return f.HeapPeakMax }, vsBase: true},
		{title: "heap in use per replica at the end of the load (largest)", v: func(f *FleetResult) float64 { return f.HeapEndMax }},
		{title: "… ÷ %s's", v: func(f *FleetResult) float64 { return f.HeapEndMax }, vsBase: true},
		{title: "heap in use, whole fleet at the end of the load (sum of replicas)", v: func(f *FleetResult) float64 { return f.HeapEndSum }},
		{title: "… ÷ %s's", v: func(f *FleetResult) float64 { return f.HeapEndSum }, vsBase: true},
	}
	if slices.ContainsFunc(fl, func(f *FleetResult) bool { return f.HeapLiveEndMax > 0 }) {
		figures = append(figures, []memoryFigure{
			{title: "live heap per replica, peak (largest; go_gc_heap_live_bytes: marked live by the last collection)", v: func(f *FleetResult) float64 { return f.HeapLivePeakMax }},
			{title: "… ÷ %s's", v: func(f *FleetResult) float64 { return f.HeapLivePeakMax }, vsBase: true},
			{title: "live heap per replica at the end of the load (largest)", v: func(f *FleetResult) float64 { return f.HeapLiveEndMax }},
			{title: "… ÷ %s's", v: func(f *FleetResult) float64 { return f.HeapLiveEndMax }, vsBase: true},
			{title: "live heap, whole fleet at the end of the load (sum of replicas)", v: func(f *FleetResult) float64 { return f.HeapLiveEndSum }},
			{title: "… ÷ %s's", v: func(f *FleetResult) float64 { return f.HeapLiveEndSum }, vsBase: true},
		}...)
	}
	figures = append(figures, memoryFigure{title: "RSS per replica, peak (largest)", v: func(f *FleetResult) float64 { return f.RSSPeakMax }})
	for _, m := range figures {
		switch {
		case !m.vsBase:
			rows = append(rows, fleetRow{m.title, field(m.v)})
		case len(fl) > 1:
			rows = append(rows, fleetRow{fmt.Sprintf(m.title, mdEscape(base.Fleet)), func(f *FleetResult) string { return memoryRatio(m.v(f), m.v(base)) }})
		}
	}
	if slices.ContainsFunc(fl, func(f *FleetResult) bool { return f.APIServerRSSPeak > 0 }) {
		rows = append(rows,
			fleetRow{"kube-apiserver RSS, peak over the fleet's life", field(func(f *FleetResult) float64 { return f.APIServerRSSPeak })},
			fleetRow{"etcd RSS, peak over the fleet's life", field(func(f *FleetResult) float64 { return f.EtcdRSSPeak })})
	}
	return append(rows, fleetRow{"peak resident memory ÷ memory limit (largest replica)", memoryLimitText})
}

// memoryFigure is a memory row: a figure of each fleet, or (vsBase) its
// ratio to the base fleet's, the title's "%s" naming the base.
type memoryFigure struct {
	title  string
	v      func(*FleetResult) float64
	vsBase bool
}

// startRows say how long each fleet's start took to reconcile the objects
// that existed before it, against the plain fleet's where there is one:
// the time to Ready that a new controller (or all of a controller's
// replicas restarting) costs.
func startRows(fl []*FleetResult) []fleetRow {
	rows := []fleetRow{
		{"objects existing at the fleet's start", func(f *FleetResult) string { return fmt.Sprint(f.StartObjects) }},
		{"fleet start → every object reconciled (and Ready at its latest generation)", func(f *FleetResult) string {
			if f.StartError != "" {
				return "not settled"
			}
			return fmtDur(f.StartSettled)
		}},
	}
	if plain := plainFleet(fl); plain != nil {
		rows = append(rows, fleetRow{fmt.Sprintf("… ÷ %s's", mdEscape(plain.Fleet)), func(f *FleetResult) string {
			if f.StartError != "" || plain.StartError != "" {
				return "n/a"
			}
			return ratio(f.StartSettled.Seconds(), plain.StartSettled.Seconds())
		}})
	}
	return append(rows,
		fleetRow{"… ConfigBinding and ConfigMap writes during it", func(f *FleetResult) string {
			if !f.StartWritesCounted {
				return "n/a"
			}
			return fmt.Sprintf("%.0f", f.StartWrites)
		}},
		fleetRow{"… initial syncs of ConfigBindings during it (LISTs and watch-lists)", func(f *FleetResult) string { return countText(f.StartSyncs) }},
		fleetRow{"… ConfigBindings the API server scanned for them ÷ objects", func(f *FleetResult) string {
			if f.StartScanned < 0 || f.StartObjects == 0 {
				return noData
			}
			return fmt.Sprintf("%.2f×", f.StartScanned/float64(f.StartObjects))
		}})
}

// stormRows say each fleet's create storm and its write rate against the
// API server's ceiling measured at the run's start: how much of what the
// server could take the fleet used when every object needed a first
// reconcile at once.
func stormRows(cal *Calibration) []fleetRow {
	ceiling := 0.0
	if cal.measured() {
		ceiling = cal.WritesPerSec
	}
	figure := func(v func(stormFigures) float64) func(*FleetResult) string {
		return func(f *FleetResult) string { return perCauseText(v(f.Storm.figures(ceiling)), "—") }
	}
	return []fleetRow{
		{"create storm", func(f *FleetResult) string { return f.Storm.describe() }},
		{"create storm: until every object Ready", func(f *FleetResult) string {
			switch {
			case f.Storm.Kind == "":
				return "—"
			case f.Storm.Kind == stormRamp:
				return "n/a (not awaited; the ramp took " + fmtDur(f.Storm.Duration) + ")"
			case !f.Storm.Settled:
				return "not settled"
			}
			return fmtDur(f.Storm.Duration)
		}},
		{"create storm: objects Ready per second", figure(func(s stormFigures) float64 { return s.ReadyPerSec })},
		{"create storm: controller writes per object", figure(func(s stormFigures) float64 { return s.WritesPerObject })},
		{"create storm: controller writes per second ÷ ceiling writes per second", func(f *FleetResult) string {
			return ceilingRatioText(f.Storm.figures(ceiling), ceiling)
		}},
	}
}

// shardRows are the labeler's and the shards' figures; a fleet without
// sharding has no labeler and holds every object.
func shardRows() []fleetRow {
	return []fleetRow{
		{"shard table at the fleet's start: domains labeled at CREATE", func(f *FleetResult) string {
			switch {
			case !f.sharded():
				return "n/a (no labeler)"
			case f.ShardTableDomains < 0:
				return "none (cold)"
			}
			return fmt.Sprint(f.ShardTableDomains)
		}},
		{"create → labeled p50 / p99", func(f *FleetResult) string {
			if f.Labeled.Count == 0 {
				return noData
			}
			return fmtDur(f.Labeled.P50) + " / " + fmtDur(f.Labeled.P99)
		}},
		{"objects waiting for a label, peak", func(f *FleetResult) string {
			switch {
			case !f.sharded():
				return "n/a (no labeler)"
			case f.UnlabeledPeak < 0:
				return "no data (not sampled)"
			}
			return fmt.Sprintf("%.0f", f.UnlabeledPeak)
		}},
		{"fleet start: peak objects held ÷ final share (largest replica)", func(f *FleetResult) string { return perCauseText(f.StartOverClaim, "—") }},
		{"ConfigBindings held per replica, peak (largest)", func(f *FleetResult) string {
			switch {
			case !f.sharded():
				return "all (one cache of every object)"
			case f.HeldMax < 0 || f.Samples == 0:
				return noData
			}
			return fmt.Sprintf("%.0f", f.HeldMax)
		}},
	}
}

// syncRows are the initial syncs of ConfigBindings: the API server's counts
// over the fleet's life, read at both ends, and the caches the replicas say
// they started.
func syncRows(fl []*FleetResult) []fleetRow {
	rows := []fleetRow{
		{"initial syncs of ConfigBindings: LISTs + watch-lists (API server)", apiCell("%.0f", func(f *FleetResult) float64 { return f.Syncs })},
		{"informer caches the replicas started (kshard_caches_started_total): for acquisitions, of shards acquired", func(f *FleetResult) string {
			switch {
			case !f.sharded():
				return "—"
			case f.CachesStarted < 0 || f.Acquisitions < 0 || f.Samples == 0:
				return noData
			}
			return fmt.Sprintf("%.0f: %.0f, of %.0f", f.CachesStarted, f.AcquisitionCaches, f.Acquisitions)
		}},
		{"ConfigBindings the API server scanned for them", apiCell("%.0f", func(f *FleetResult) float64 { return f.Scanned })},
		{"… per replica process", apiCell("%.0f", func(f *FleetResult) float64 { return f.ScannedPerProcess })},
	}
	if len(fl) > 1 {
		single := singletonFleet(fl)
		rows = append(rows, fleetRow{"ConfigBindings scanned for initial syncs ÷ singleton's", func(f *FleetResult) string {
			switch {
			case single == nil:
				return "—"
			case !f.APICounted || !single.APICounted:
				return noData
			}
			return ratio(f.Scanned, single.Scanned)
		}})
	}
	return append(rows,
		fleetRow{"ConfigBinding bytes sent: LIST responses + watch events (API server)", func(f *FleetResult) string {
			if !f.APICounted {
				return noData
			}
			return formatBytes(f.Bytes)
		}},
		fleetRow{"ConfigBinding watches open at the end (API server)", apiCell("%.0f", func(f *FleetResult) float64 { return f.OpenWatches })})
}

// phaseRows are the measured phase's figures: latency, rates, where the
// time went, and the config center's and the cache's share.
func phaseRows() []fleetRow {
	latency := func(v func(LatencySummary) time.Duration) func(*FleetResult) string {
		return func(f *FleetResult) string { return f.Updates.dur(v(f.Updates)) }
	}
	return []fleetRow{
		{"end-to-end p50", latency(func(s LatencySummary) time.Duration { return s.P50 })},
		{"end-to-end p90", latency(func(s LatencySummary) time.Duration { return s.P90 })},
		{"end-to-end p99", latency(func(s LatencySummary) time.Duration { return s.P99 })},
		{"end-to-end max", latency(func(s LatencySummary) time.Duration { return s.Max })},
		{"updates Ready within 1 s / 5 s", func(f *FleetResult) string {
			if f.Updates.Count == 0 {
				return noData
			}
			return pct(f.Updates.WithinFast) + " / " + pct(f.Updates.WithinSLO)
		}},
		{"updates offered per second", phaseRate("%.1f", false, func(f *FleetResult) float64 { return f.Offered })},
		{"throughput: generations Ready per second", func(f *FleetResult) string {
			// None Ready of none offered is no rate; of some, it is 0.
			if f.Updates.Count == 0 && f.SpecUpdates == 0 {
				return noData
			}
			return phaseRate("%.1f", false, func(f *FleetResult) float64 { return f.Throughput })(f)
		}},
		{"reconciles per second", phaseRate("%.1f", true, func(f *FleetResult) float64 { return f.Reconciles })},
		{"replicas' CPU in the phase, all replicas (cores)", phaseRate("%.2f", true, func(f *FleetResult) float64 { return f.CPUCores })},
		{"end-to-end p50 / p99 split: write → its reconcile starts + reconcile starts → Ready seen (audit log)", splitText},
		{"workqueue wait p99 (controller-runtime histogram)", func(f *FleetResult) string { return secondsText(f.QueueWaitP99) }},
		{"reconcile p99 (controller-runtime histogram)", func(f *FleetResult) string { return secondsText(f.ReconcileP99) }},
		{"API server's status patch p99 (its own histogram)", func(f *FleetResult) string { return secondsText(f.StatusPatchP99) }},
		{"config-center key reads in the phase", func(f *FleetResult) string { return countText(f.CenterGets) }},
		{"… per spec update", func(f *FleetResult) string {
			if f.Updates.Count == 0 || f.CenterGets < 0 {
				return noData
			}
			return fmt.Sprintf("%.2f", f.CenterGets/float64(f.Updates.Count))
		}},
		{"config-center key reads outside it (warm-up, settle)", func(f *FleetResult) string { return countText(f.CenterGetsOutside) }},
		{"external-cache hit ratio (fresh or stale)", func(f *FleetResult) string {
			switch {
			case f.Plain:
				return "n/a (no cache)"
			case f.CacheHitRatio < 0:
				return noData + " (no lookups)"
			}
			return pct(f.CacheHitRatio)
		}},
		{"Ready flaps: True → False at an unchanged generation", func(f *FleetResult) string { return fmt.Sprint(f.ReadyFlaps) }},
	}
}

// propagationRows say how fast config-center changes reached the
// ConfigMaps, for runs that wrote such changes.
func propagationRows() []fleetRow {
	return []fleetRow{
		{"config-center changes written (probes)", func(f *FleetResult) string { return fmt.Sprint(f.Propagation.Probes) }},
		{"change → ConfigMap p50 / p99 / max", func(f *FleetResult) string {
			l := f.Propagation.Latency
			if l.Count == 0 {
				return noData
			}
			return fmtDur(l.P50) + " / " + fmtDur(l.P99) + " / " + fmtDur(l.Max)
		}},
		{"… ConfigMaps that showed the change within 1 min", func(f *FleetResult) string {
			return fmt.Sprintf("%d of %d", f.Propagation.Reached, f.Propagation.Expected)
		}},
	}
}

// writeRows are the API server's write rates and what one spec update
// cost in the controller's writes.
func writeRows() []fleetRow {
	return []fleetRow{
		{"Lease writes per second (API server)", apiCell("%.1f", func(f *FleetResult) float64 { return f.LeaseWritesPerSec })},
		{"API writes per second, all (API server)", apiCell("%.1f", func(f *FleetResult) float64 { return f.WritesPerSec })},
		{"controller API writes per spec update", func(f *FleetResult) string { return perCauseText(f.ControllerWritesPerUpdate, noData) }},
		{"… ConfigBinding and ConfigMap writes in the phase, the load tester's own subtracted / spec updates", func(f *FleetResult) string {
			if !f.WritesCounted {
				return fmt.Sprintf("%s / %d", noData, f.SpecUpdates)
			}
			return fmt.Sprintf("%.0f / %d", f.ControllerWrites, f.SpecUpdates)
		}},
	}
}

// apiCell is a figure from the API server's counts over the fleet's life,
// no data unless they were read at both ends.
func apiCell(format string, v func(*FleetResult) float64) func(*FleetResult) string {
	return func(f *FleetResult) string {
		if !f.APICounted {
			return noData
		}
		return fmt.Sprintf(format, v(f))
	}
}

// phaseRate is a rate over the measured phase; one from the replicas'
// scrapes (scraped) needs some.
func phaseRate(format string, scraped bool, v func(*FleetResult) float64) func(*FleetResult) string {
	return func(f *FleetResult) string {
		if f.Window <= 0 || (scraped && f.Samples == 0) {
			return noData
		}
		return fmt.Sprintf(format, v(f))
	}
}

// secondsText writes a figure in seconds that is -1 without data.
func secondsText(v float64) string {
	if v < 0 {
		return noData
	}
	return fmtDur(time.Duration(v * float64(time.Second)))
}

// splitText writes the end-to-end latency split at the reconcile that did
// the work.
func splitText(f *FleetResult) string {
	switch {
	case f.Split == nil:
		return "n/a (no audit log)"
	case f.Split.Joined == 0:
		return fmt.Sprintf("%s (0 of %d updates joined with their reconcile)", noData, f.Split.Updates)
	}
	return fmt.Sprintf("%s + %s / %s + %s (%d of %d updates)", fmtDur(f.Split.ToReconcile.P50), fmtDur(f.Split.FromReconcile.P50),
		fmtDur(f.Split.ToReconcile.P99), fmtDur(f.Split.FromReconcile.P99), f.Split.Joined, f.Split.Updates)
}

// renderReplicas writes a row per replica identity of every fleet.
func renderReplicas(b *strings.Builder, fl []*FleetResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\nPer replica (over each fleet's life; a restarted replica's processes together):\n\n")
	p("| fleet | replica | processes | heap peak | heap at the end of the load | RSS peak | shards at the end of the load | ConfigBindings held, peak | reconciles | cache hit ratio |\n")
	p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, f := range fl {
		for _, rr := range f.PerReplica {
			held, shards := "all", "-"
			if rr.HasShardMetrics {
				held, shards = fmt.Sprintf("%.0f", rr.HeldPeak), countText(rr.ShardsEnd)
				if f.HeldMax < 0 {
					held = noData // no scrape of the fleet had the family
				}
			}
			reconciles := fmt.Sprintf("%.0f", rr.Reconciles)
			if rr.Samples == 0 {
				reconciles = noData
				if rr.HasShardMetrics {
					held, shards = noData, noData
				}
			}
			hit := "n/a"
			switch {
			case rr.CacheHitRatio >= 0:
				hit = pct(rr.CacheHitRatio)
			case !f.Plain:
				hit = noData
			}
			p("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", mdEscape(f.Fleet), rr.Replica, rr.Processes,
				memoryText(rr.HeapPeak), memoryText(rr.HeapEnd), memoryText(rr.RSSPeak), shards, held, reconciles, hit)
		}
	}
}

// sharded says the fleet ran kshard with sharding on: it has a labeler,
// shard Leases and the kshard_shard_* metrics.
func (f *FleetResult) sharded() bool {
	return !f.Plain && (Mode{Name: f.Mode, Args: f.Args}).Sharded()
}

// ceilingRatioText writes a storm's write rate, the ceiling and their
// ratio, so the cell says what it divides.
func ceilingRatioText(fig stormFigures, ceiling float64) string {
	switch {
	case fig.WritesPerSec < 0:
		return "—"
	case ceiling <= 0:
		return fmt.Sprintf("%.0f ÷ n/a (not calibrated)", fig.WritesPerSec)
	}
	return fmt.Sprintf("%.0f ÷ %.0f = %.2f", fig.WritesPerSec, ceiling, fig.OfCeiling)
}

// memoryLimitText writes a fleet's largest peak resident memory, its
// replicas' memory limit and their ratio, so the cell says what it divides.
func memoryLimitText(f *FleetResult) string {
	switch {
	case f.Plain:
		return "n/a (no --memory-limit)"
	case f.MemoryLimit <= 0:
		return "n/a (--memory-limit 0)"
	case f.RSSPeakMax <= 0:
		return noData + " ÷ " + formatBytes(f.MemoryLimit)
	}
	return fmt.Sprintf("%s ÷ %s = %.2f", formatBytes(f.RSSPeakMax), formatBytes(f.MemoryLimit), f.RSSPeakMax/f.MemoryLimit)
}

// singletonFleet is the run's fleet with sharding off (one active replica
// of `kshard controller` holding every object), the baseline of
// compare-sharding; nil without one. The plain fleet is not it: the ratio
// says what sharding changes in kshard.
func singletonFleet(fl []*FleetResult) *FleetResult {
	for _, f := range fl {
		if !f.Plain && !f.sharded() {
			return f
		}
	}
	return nil
}

// plainFleet is the run's fleet of cmd/plaincontroller, the floor of
// compare-sharding; nil without one.
func plainFleet(fl []*FleetResult) *FleetResult {
	for _, f := range fl {
		if f.Plain {
			return f
		}
	}
	return nil
}

// code writes flags as inline code, "—" for none.
func code(args []string) string {
	if len(args) == 0 {
		return "—"
	}
	return "`" + strings.Join(args, " ") + "`"
}
