package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/loadtest/chart"
)

// writeReport writes <scenario>.md, its charts and <scenario>.json into the
// report folder.
func (r *run) writeReport() error {
	rep := r.report
	name := r.opts.Scenario
	for _, c := range r.charts() {
		file := name + "-" + c.file + ".svg"
		var buf bytes.Buffer
		if err := c.chart.Write(&buf); err != nil {
			return fmt.Errorf("drawing %s: %w", file, err)
		}
		if err := os.WriteFile(filepath.Join(r.opts.Out, file), buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", file, err)
		}
		rep.Charts = append(rep.Charts, Chart{Title: c.chart.Title, File: file})
	}
	rep.guide = readmeFrom(r.opts.Out)
	md := renderMarkdown(rep)
	if err := os.WriteFile(filepath.Join(r.opts.Out, name+".md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(r.opts.Out, name+".json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// readmeFrom is the path of loadtest/README.md relative to a report folder
// in the repository (loadtest/results, or a folder under it), so the
// report's link to it works; "" when the folder is elsewhere.
func readmeFrom(out string) string {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return ""
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return ""
	}
	rel, err := filepath.Rel(abs, filepath.Join(root, "loadtest", "README.md"))
	if err != nil || !strings.HasPrefix(abs, root+string(filepath.Separator)) {
		return ""
	}
	return filepath.ToSlash(rel)
}

type namedChart struct {
	file  string
	chart *chart.Chart
}

// chartData is what the charts are drawn from: the run's samples, copied
// under its lock, and the x axis (seconds since the run began).
type chartData struct {
	scenario string
	begin    time.Time
	span     time.Duration
	markers  []chart.Marker
	center   []centerSample
	reasons  []reasonSample
	sizes    []sizeSample
}

// secs is a time's x: seconds since the start of the run.
func (d *chartData) secs(t time.Time) float64 { return t.Sub(d.begin).Seconds() }

// chart is a chart of the run with the common x axis and the run's event
// markers.
func (d *chartData) chart(title, yLabel string, series ...chart.Series) *chart.Chart {
	return &chart.Chart{Title: d.scenario + ": " + title, XLabel: "seconds since the start of the run", YLabel: yLabel, Series: series, Markers: d.markers}
}

// charts draws the run's charts: latency, throughput, ownership,
// config-center calls and heap for every scenario, plus what a scenario
// adds.
func (r *run) charts() []namedChart {
	d := &chartData{scenario: r.opts.Scenario, begin: r.begin, span: time.Since(r.begin)}
	r.mu.Lock()
	for _, m := range r.markers {
		d.markers = append(d.markers, chart.Marker{X: d.secs(m.At), Label: m.Label})
	}
	d.center = slices.Clone(r.center)
	d.reasons = slices.Clone(r.reasons)
	d.sizes = slices.Clone(r.sizes)
	r.mu.Unlock()
	out := d.latencyCharts(r.tracker.samplesCopy())
	out = append(out,
		namedChart{"ownership", d.ownershipChart(r.ring.ownershipSeries())},
		namedChart{"calls", d.callsChart()},
		namedChart{"heap", d.heapChart(r.fleets)})
	if r.sc.name == "external-outage" {
		out = append(out, namedChart{"reasons", d.reasonsChart()})
	}
	if r.sc.name == "autoscale" || r.sc.name == "scale-out" {
		out = append(out, namedChart{"replicas", d.replicasChart()})
	}
	return out
}

// latencyCharts are the percentiles of the generations that became Ready
// in each window, and how many per second.
func (d *chartData) latencyCharts(samples []latencySample) []namedChart {
	window := max(5*time.Second, (d.span / 60).Round(time.Second))
	buckets := map[int64]*histogram{}
	for _, s := range samples {
		k := int64(s.Done.Sub(d.begin) / window)
		if buckets[k] == nil {
			buckets[k] = &histogram{}
		}
		buckets[k].Observe(s.Latency)
	}
	var p50, p99, mx, n []chart.Point
	for _, k := range slices.Sorted(maps.Keys(buckets)) {
		x := (time.Duration(k)*window + window/2).Seconds()
		h := buckets[k]
		p50 = append(p50, chart.Point{X: x, Y: h.Quantile(0.5).Seconds()})
		p99 = append(p99, chart.Point{X: x, Y: h.Quantile(0.99).Seconds()})
		mx = append(mx, chart.Point{X: x, Y: h.Max().Seconds()})
		n = append(n, chart.Point{X: x, Y: float64(h.Count()) / window.Seconds()})
	}
	return []namedChart{
		{"latency", d.chart(fmt.Sprintf("spec change (or create) to status Ready, per %s window", window), "seconds",
			chart.Series{Name: "p50", Points: p50}, chart.Series{Name: "p99", Points: p99}, chart.Series{Name: "max", Points: mx})},
		{"throughput", d.chart(fmt.Sprintf("generations seen Ready per second, per %s window", window), "per second",
			chart.Series{Name: "Ready/s", Points: n})},
	}
}

// ownershipChart is the shards owned per replica (by a running holder).
func (d *chartData) ownershipChart(points []ownershipPoint) *chart.Chart {
	holders := map[string]bool{}
	for _, p := range points {
		for h := range p.Count {
			holders[h] = true
		}
	}
	var own []chart.Series
	for _, h := range slices.Sorted(maps.Keys(holders)) {
		s := chart.Series{Name: h, Step: true}
		for _, p := range points {
			s.Points = append(s.Points, chart.Point{X: d.secs(p.At), Y: float64(p.Count[h])})
		}
		if len(points) > 0 {
			s.Points = append(s.Points, chart.Point{X: d.span.Seconds(), Y: float64(points[len(points)-1].Count[h])})
		}
		own = append(own, s)
	}
	return d.chart("shards owned per replica (Lease held, unexpired, process running)", "shards", own...)
}

// callsChart is the config-center calls per second by the replicas.
func (d *chartData) callsChart() *chart.Chart {
	var gets, polls []chart.Point
	for i := 1; i < len(d.center); i++ {
		prev, cur := d.center[i-1], d.center[i]
		dt := cur.At.Sub(prev.At).Seconds()
		if dt <= 0 {
			continue
		}
		gets = append(gets, chart.Point{X: d.secs(cur.At), Y: math.Max(0, cur.Gets-prev.Gets) / dt})
		polls = append(polls, chart.Point{X: d.secs(cur.At), Y: math.Max(0, cur.Polls-prev.Polls) / dt})
	}
	return d.chart("config-center calls per second by the replicas", "calls per second",
		chart.Series{Name: "key reads", Points: gets}, chart.Series{Name: "change-feed polls", Points: polls})
}

// heapChart is the Go heap per replica identity, its processes joined.
func (d *chartData) heapChart(fleets []*fleet) *chart.Chart {
	var heap []chart.Series
	for _, f := range fleets {
		f.mu.Lock()
		for _, s := range f.slots {
			for _, in := range s.instances {
				if len(in.samples) == 0 {
					continue
				}
				ser := chart.Series{Name: fmt.Sprintf("%s %s", f.mode.Name, s.id)}
				for _, x := range in.samples {
					ser.Points = append(ser.Points, chart.Point{X: d.secs(x.At), Y: x.HeapInuse / (1 << 20)})
				}
				heap = append(heap, ser)
			}
		}
		f.mu.Unlock()
	}
	return d.chart("Go heap in use per replica (go_memstats_heap_inuse_bytes)", "MiB", mergeByName(heap)...)
}

// reasonsChart is the ConfigBindings by Ready reason (external-outage).
func (d *chartData) reasonsChart() *chart.Chart {
	reasons := []string{"Synced", "ExternalUnavailable"}
	series := make([]chart.Series, len(reasons))
	for i, reason := range reasons {
		series[i].Name = reason
		for _, rs := range d.reasons {
			series[i].Points = append(series[i].Points, chart.Point{X: d.secs(rs.At), Y: float64(rs.Reasons[reason])})
		}
	}
	return d.chart("ConfigBindings by Ready reason", "objects", series...)
}

// replicasChart is the running replicas and the ConfigBindings, in
// thousands (autoscale, scale-out).
func (d *chartData) replicasChart() *chart.Chart {
	var rp, objs []chart.Point
	for _, s := range d.sizes {
		rp = append(rp, chart.Point{X: d.secs(s.At), Y: float64(s.Replicas)})
	}
	for _, rs := range d.reasons {
		total := 0
		for _, v := range rs.Reasons {
			total += v
		}
		objs = append(objs, chart.Point{X: d.secs(rs.At), Y: float64(total) / 1000})
	}
	return d.chart("running replicas, and ConfigBindings (thousands)", "replicas / thousands of objects",
		chart.Series{Name: "replicas", Points: rp, Step: true}, chart.Series{Name: "objects (k)", Points: objs})
}

// mergeByName joins series of one name (one replica identity's process
// instances) into one, in time order.
func mergeByName(in []chart.Series) []chart.Series {
	var out []chart.Series
	idx := map[string]int{}
	for _, s := range in {
		if i, ok := idx[s.Name]; ok {
			out[i].Points = append(out[i].Points, s.Points...)
			continue
		}
		idx[s.Name] = len(out)
		out = append(out, s)
	}
	for i := range out {
		sort.SliceStable(out[i].Points, func(a, b int) bool { return out[i].Points[a].X < out[i].Points[b].X })
	}
	return out
}

// renderMarkdown writes the report a person reads: its sections in order.
func renderMarkdown(rep *Report) string {
	var b strings.Builder
	renderHeader(&b, rep)
	renderChecks(&b, rep)
	renderCapacity(&b, rep.Capacity)
	if len(rep.Fleets) > 0 {
		renderFleets(&b, rep)
	}
	if len(rep.Events) > 0 {
		renderEvents(&b, rep.Events)
	}
	renderLatency(&b, rep)
	renderCharts(&b, rep)
	return b.String()
}

// renderHeader writes the title, the verdict, how to reproduce the run,
// where it ran and its settings.
func renderHeader(b *strings.Builder, rep *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("# kshard load test: %s\n\n", rep.Scenario)
	p("%s\n\n", rep.Description)
	verdict := "PASSED"
	if !rep.Passed {
		verdict = "FAILED"
	}
	gate := "the checks are reported; this scenario's exit code does not depend on them"
	if rep.Gated {
		gate = "the checks decide this scenario's exit code"
	}
	p("**Result: %s** (%s).\n\n", verdict, gate)
	if rep.Error != "" {
		p("**The run failed:** %s\n\n", mdEscape(rep.Error))
	}
	p("Reproduce with:\n\n```sh\n%s\n```\n\n", rep.Command)
	m := rep.Machine
	where := fmt.Sprintf("kube-apiserver %s and etcd on the same machine, every process on loopback", orUnknown(m.KubeAPIServer))
	if m.Pods != "" {
		where = fmt.Sprintf("kube-apiserver %s of the --kubeconfig cluster, the replicas %s", orUnknown(m.KubeAPIServer), m.Pods)
	}
	load := "no data (not sampled)"
	if m.LoadMax >= 0 {
		load = fmt.Sprintf("%.1f on average and %.1f at most", m.LoadMean, m.LoadMax)
	}
	p("Machine: %d CPUs (%s), %s, %s; %s. "+
		"Run on %s, %s, wall time %s. The machine is shared: its 1-minute load average was %s during the run "+
		"(the load tester, the control plane, the replicas and whatever else ran), so compare numbers within a report, not across machines.\n\n",
		m.CPUs, m.CPUModel, m.GoVersion, m.OS, where, rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Source, rep.Wall.Round(time.Second), load)
	p("| setting | value |\n| --- | --- |\n")
	for _, s := range rep.Settings {
		p("| %s | %s |\n", s[0], mdEscape(s[1]))
	}
}

// renderChecks writes the checks and the findings.
func renderChecks(b *strings.Builder, rep *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Checks\n\n| check | result | detail |\n| --- | --- | --- |\n")
	for _, c := range rep.Checks {
		p("| %s | %s | %s |\n", mdEscape(c.Name), c.result(), mdEscape(c.Detail))
	}
	if len(rep.Findings) > 0 {
		p("\n## Findings\n\n")
		for _, f := range rep.Findings {
			p("- %s\n", mdEscape(f))
		}
	}
}

// renderEvents writes a row per event: what moved, when it settled, what
// it cost in writes.
func renderEvents(b *strings.Builder, events []EventResult) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Events\n\nTimes from the event (the signal, the start of the new process, the first write of a batch). " +
		"*Shards held*: every running replica a live ring member and every shard held by the running replica the ring assigns it (membership changes only). " +
		"*Settled*: every object of a shard acquired since the event reconciled by its new holder (audit logs)" +
		" and, unless the event happened under continuous updates, every object Ready at its latest generation. " +
		"*Shards moved*: shards acquired since the event, by anyone; *… to another replica*: shards whose running holder when the event settled differs from the one right before it " +
		"(a rolling restart's goal is 0: the restarted replica takes its own shards back; —: no shard had a running holder before, or no shards). " +
		"*Object writes per moved object*: the API server's mutating requests (POST, PUT, PATCH, APPLY, DELETE) on ConfigBindings and ConfigMaps, " +
		"any subresource, from right before the event until it settled, less the load tester's own, divided by the objects in the moved shards; " +
		"counted for events without load only (—: under load, or nothing moved).\n\n")
	p("| event | at | shards moved | shards moved to another replica | objects in them | shards held after | settled after | object writes per moved object |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, ev := range events {
		reconciled := fmtDur(ev.Reconciled)
		if ev.Error != "" {
			reconciled = "**not settled**: " + mdEscape(ev.Error)
		}
		held := "-"
		if ev.Handover {
			held = fmtDur(ev.Held)
		}
		toOther := "—"
		if ev.MovedToOther >= 0 {
			toOther = fmt.Sprint(ev.MovedToOther)
		}
		p("| %s | %s | %d | %s | %d | %s | %s | %s |\n", mdEscape(ev.Name), fmtDur(ev.At), ev.Moved, toOther, ev.Objects, held, reconciled, perCauseText(ev.WritesPerMoved, "—"))
	}
	if n, own := eventOwnWrites(events); n > 0 && own == 0 {
		p("\nThe load tester wrote no ConfigBinding or ConfigMap during any event whose writes were counted (%d of %d events): every write counted there is the replicas'.\n", n, len(events))
	} else if n > 0 {
		p("\nThe load tester's own ConfigBinding and ConfigMap writes during the events whose writes were counted (%d of %d events), %d in all, are subtracted.\n", n, len(events), own)
	}
}

// renderLatency writes the run's end-to-end latencies and the spec
// updates' distribution.
func renderLatency(b *strings.Builder, rep *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## End-to-end latency\n\nFrom sending a write to the watch showing status Ready at that generation " +
		"(`observedGeneration` and the Ready condition's `observedGeneration` both at it). Updates: the measured phases; creates: the whole run.\n\n")
	p("| | samples | p50 | p90 | p99 | max | ≤ 1 s | ≤ 5 s |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, row := range []struct {
		name string
		s    LatencySummary
	}{{"spec updates", rep.Updates}, {"creates", rep.Creates}, {"… of which until the shard label shows", rep.Labeled}} {
		s := row.s
		p("| %s | %d | %s | %s | %s | %s | %s | %s |\n", row.name, s.Count, s.dur(s.P50), s.dur(s.P90), s.dur(s.P99), s.dur(s.Max), s.share(s.WithinFast), s.share(s.WithinSLO))
	}
	p("\nDistribution of spec updates:\n\n| at most | updates | cumulative |\n| ---: | ---: | ---: |\n")
	cum := 0
	for i, c := range rep.Updates.Buckets {
		cum += c
		bound := "above " + fmtDur(LatencyBuckets[len(LatencyBuckets)-1])
		if i < len(LatencyBuckets) {
			bound = fmtDur(LatencyBuckets[i])
		}
		share := noData
		if rep.Updates.Count > 0 {
			share = pct(float64(cum) / float64(rep.Updates.Count))
		}
		p("| %s | %d | %s |\n", bound, c, share)
	}
}

// renderCharts writes the charts, the notes and the link to what every
// number means.
func renderCharts(b *strings.Builder, rep *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if len(rep.Charts) > 0 {
		p("\n## Charts\n\nDashed lines mark the run's events.\n\n")
		for _, c := range rep.Charts {
			p("![%s](%s)\n\n", mdEscape(c.Title), c.File)
		}
	}
	if len(rep.Notes) > 0 {
		p("## Notes\n\n")
		for _, n := range rep.Notes {
			p("- %s\n", mdEscape(n))
		}
		p("\n")
	}
	guide := rep.guide
	if guide == "" {
		guide = "../README.md"
	}
	p("What every number means: [loadtest/README.md](%s#what-the-numbers-mean).\n", guide)
}

// result is a check's result cell: a check without data fails as such,
// and one that did not apply is not a pass.
func (c Check) result() string {
	switch {
	case c.NoData:
		return "**FAIL** (no data)"
	case !c.Passed:
		return "**FAIL**"
	case c.NotApplicable:
		return "n/a"
	}
	return "pass"
}

// renderCapacity writes the capacity scenario's search: a summary row per
// fleet, then every window.
func renderCapacity(b *strings.Builder, caps []CapacityResult) {
	if len(caps) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Capacity\n\nThe highest spec-update rate at which a window of load held both objectives: update → Ready p99 ≤ %s "+
		"and 99 %% of work-queue waits ≤ %s (the replicas' workqueue_queue_duration_seconds), with every update Ready. "+
		"The rate rises by ×%.1f until one window holds and one misses, then the bracket is bisected %d times.\n\n",
		fmtDur(capacityObjective), fmtDur(capacityObjective), capacityStep, capacityBisections)
	p("| fleet | capacity (updates/s) | lowest rate missed | ÷ (replicas × first fleet's per replica) | largest replica's objects ÷ mean | replicas' CPU with no load (cores) |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	per := 0.0
	if caps[0].Capacity > 0 {
		per = caps[0].Capacity / float64(caps[0].Replicas)
	}
	for _, c := range caps {
		eff := noData
		if per > 0 && c.Capacity > 0 {
			eff = fmt.Sprintf("%.2f", c.Capacity/(per*float64(c.Replicas)))
		}
		p("| %s | %.1f | %s | %s | %.2f | %s |\n", mdEscape(c.Fleet), c.Capacity, orNone(c.Missed), eff, c.SharesMax, coresText(c.IdleCores))
	}
	p("\n| fleet | rate asked | updates sent / Ready | update → Ready p99 | work-queue waits ≤ %s | replicas' CPU (cores) | CFS periods throttled | kube-apiserver CPU (cores) | window |\n"+
		"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n", fmtDur(capacityObjective))
	for _, c := range caps {
		for _, w := range c.Windows {
			verdict := "held"
			if !w.Held {
				verdict = "missed: " + w.Why
			}
			p("| %s | %.1f | %d / %d | %s | %s | %s | %s | %s | %s |\n", mdEscape(c.Fleet), w.Rate, w.Sent, w.Ready, fmtDur(w.P99),
				shareText(w.QueueWithin), coresText(w.ReplicaCores), shareText(w.Throttled), coresText(w.APIServerCores), mdEscape(verdict))
		}
	}
}

// orNone is a rate, or "none" for 0.
func orNone(v float64) string {
	if v <= 0 {
		return "none"
	}
	return fmt.Sprintf("%.1f", v)
}

// shareText is a share as a percentage, or no data for a negative one.
func shareText(v float64) string {
	if v < 0 {
		return noData
	}
	return pct(v)
}

// coresText is CPU cores, or no data for a negative figure.
func coresText(v float64) string {
	if v < 0 {
		return noData
	}
	return fmt.Sprintf("%.2f", v)
}

// eventOwnWrites is the number of events whose object writes were counted,
// and the load tester's own writes during them.
func eventOwnWrites(evs []EventResult) (counted int, own int64) {
	for _, ev := range evs {
		if ev.WritesCounted {
			counted++
			own += ev.OwnWrites
		}
	}
	return counted, own
}

// perCauseText writes a perCause figure with two decimals, or none where
// there is no figure.
func perCauseText(v float64, none string) string {
	if v < 0 {
		return none
	}
	return fmt.Sprintf("%.2f", v)
}

func ratio(a, b float64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func pct(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }

// noData is what the report says for a figure computed from nothing (no
// sample, a zero denominator), where a 0, a 0 ms or a 100 % would read as
// a measurement.
const noData = "no data"

// dur writes one of the summary's latencies, "no data" without samples.
func (s LatencySummary) dur(d time.Duration) string {
	if s.Count == 0 {
		return noData
	}
	return fmtDur(d)
}

// share writes one of the summary's shares, "no data" without samples.
func (s LatencySummary) share(v float64) string {
	if s.Count == 0 || v < 0 {
		return noData
	}
	return pct(v)
}

// memoryText writes a process's memory figure; 0 is no sample, as a running
// process always has some.
func memoryText(b float64) string {
	if b <= 0 {
		return noData
	}
	return formatBytes(b)
}

// memoryRatio divides two memory figures, "no data" unless both were
// measured.
func memoryRatio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return noData
	}
	return ratio(a, b)
}

// countText writes a count that is -1 without samples.
func countText(v float64) string {
	if v < 0 {
		return noData
	}
	return fmt.Sprintf("%.0f", v)
}

func orUnknown(s string) string {
	if s == "" {
		return "(version unknown)"
	}
	return s
}

// fmtDur writes a duration for a table: 12 ms, 1.23 s, 2m5s.
func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return "< 1 ms"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.2f s", d.Seconds())
	default:
		return d.Round(time.Second).String()
	}
}

// mdEscape keeps table cells in one cell.
func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
