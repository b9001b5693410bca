package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
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

// charts draws the run's charts: latency, ownership, config-center calls
// and heap for every scenario, plus what a scenario adds.
func (r *run) charts() []namedChart {
	secs := func(t time.Time) float64 { return t.Sub(r.begin).Seconds() }
	r.mu.Lock()
	markers := make([]chart.Marker, 0, len(r.markers))
	for _, m := range r.markers {
		markers = append(markers, chart.Marker{X: secs(m.At), Label: m.Label})
	}
	center := append([]centerSample(nil), r.center...)
	reasons := append([]reasonSample(nil), r.reasons...)
	sizes := append([]sizeSample(nil), r.sizes...)
	r.mu.Unlock()
	const xl = "seconds since the start of the run"
	var out []namedChart

	// Latency over time: percentiles of the generations that became Ready
	// in each window.
	samples := r.tracker.samplesCopy()
	span := time.Since(r.begin)
	window := max(5*time.Second, (span / 60).Round(time.Second))
	type agg struct{ h histogram }
	buckets := map[int64]*agg{}
	for _, s := range samples {
		k := int64(s.Done.Sub(r.begin) / window)
		if buckets[k] == nil {
			buckets[k] = &agg{}
		}
		buckets[k].h.Observe(s.Latency)
	}
	keys := make([]int64, 0, len(buckets))
	for k := range buckets {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	var p50, p99, mx, n []chart.Point
	for _, k := range keys {
		x := (time.Duration(k)*window + window/2).Seconds()
		h := &buckets[k].h
		p50 = append(p50, chart.Point{X: x, Y: h.Quantile(0.5).Seconds()})
		p99 = append(p99, chart.Point{X: x, Y: h.Quantile(0.99).Seconds()})
		mx = append(mx, chart.Point{X: x, Y: h.Max().Seconds()})
		n = append(n, chart.Point{X: x, Y: float64(h.Count()) / window.Seconds()})
	}
	out = append(out, namedChart{"latency", &chart.Chart{
		Title:  fmt.Sprintf("%s: spec change (or create) to status Ready, per %s window", r.opts.Scenario, window),
		XLabel: xl, YLabel: "seconds",
		Series:  []chart.Series{{Name: "p50", Points: p50}, {Name: "p99", Points: p99}, {Name: "max", Points: mx}},
		Markers: markers,
	}})
	out = append(out, namedChart{"throughput", &chart.Chart{
		Title:  fmt.Sprintf("%s: generations seen Ready per second, per %s window", r.opts.Scenario, window),
		XLabel: xl, YLabel: "per second",
		Series: []chart.Series{{Name: "Ready/s", Points: n}}, Markers: markers,
	}})

	// Shards owned per replica (by a running holder), and unowned.
	points := r.ring.ownershipSeries()
	holders := map[string]bool{}
	for _, p := range points {
		for h := range p.Count {
			holders[h] = true
		}
	}
	names := make([]string, 0, len(holders))
	for h := range holders {
		names = append(names, h)
	}
	sort.Strings(names)
	var own []chart.Series
	for _, h := range names {
		s := chart.Series{Name: h, Step: true}
		for _, p := range points {
			s.Points = append(s.Points, chart.Point{X: secs(p.At), Y: float64(p.Count[h])})
		}
		if len(points) > 0 {
			s.Points = append(s.Points, chart.Point{X: span.Seconds(), Y: float64(points[len(points)-1].Count[h])})
		}
		own = append(own, s)
	}
	out = append(out, namedChart{"ownership", &chart.Chart{
		Title:  r.opts.Scenario + ": shards owned per replica (Lease held, unexpired, process running)",
		XLabel: xl, YLabel: "shards", Series: own, Markers: markers,
	}})

	// Config-center calls per second.
	var gets, polls []chart.Point
	for i := 1; i < len(center); i++ {
		dt := center[i].At.Sub(center[i-1].At).Seconds()
		if dt <= 0 {
			continue
		}
		x := secs(center[i].At)
		gets = append(gets, chart.Point{X: x, Y: math.Max(0, center[i].Gets-center[i-1].Gets) / dt})
		polls = append(polls, chart.Point{X: x, Y: math.Max(0, center[i].Polls-center[i-1].Polls) / dt})
	}
	out = append(out, namedChart{"calls", &chart.Chart{
		Title:  r.opts.Scenario + ": config-center calls per second by the replicas",
		XLabel: xl, YLabel: "calls per second",
		Series: []chart.Series{{Name: "key reads", Points: gets}, {Name: "change-feed polls", Points: polls}}, Markers: markers,
	}})

	// Heap per replica process.
	var heap []chart.Series
	for _, f := range r.fleets {
		f.mu.Lock()
		for _, s := range f.slots {
			for _, in := range s.instances {
				if len(in.samples) == 0 {
					continue
				}
				ser := chart.Series{Name: fmt.Sprintf("%s %s", f.mode.Name, s.id)}
				for _, x := range in.samples {
					ser.Points = append(ser.Points, chart.Point{X: secs(x.At), Y: x.HeapInuse / (1 << 20)})
				}
				heap = append(heap, ser)
			}
		}
		f.mu.Unlock()
	}
	heap = mergeByName(heap)
	out = append(out, namedChart{"heap", &chart.Chart{
		Title:  r.opts.Scenario + ": Go heap in use per replica (go_memstats_heap_inuse_bytes)",
		XLabel: xl, YLabel: "MiB", Series: heap, Markers: markers,
	}})

	if r.sc.name == "external-outage" {
		counts := map[string][]chart.Point{}
		for _, rs := range reasons {
			for _, reason := range []string{"Synced", "ExternalUnavailable"} {
				counts[reason] = append(counts[reason], chart.Point{X: secs(rs.At), Y: float64(rs.Reasons[reason])})
			}
		}
		out = append(out, namedChart{"reasons", &chart.Chart{
			Title:  r.opts.Scenario + ": ConfigBindings by Ready reason",
			XLabel: xl, YLabel: "objects",
			Series:  []chart.Series{{Name: "Synced", Points: counts["Synced"]}, {Name: "ExternalUnavailable", Points: counts["ExternalUnavailable"]}},
			Markers: markers,
		}})
	}
	if r.sc.name == "autoscale" || r.sc.name == "scale-out" {
		var rp, objs []chart.Point
		for _, s := range sizes {
			rp = append(rp, chart.Point{X: secs(s.At), Y: float64(s.Replicas)})
		}
		for _, rs := range reasons {
			total := 0
			for _, v := range rs.Reasons {
				total += v
			}
			objs = append(objs, chart.Point{X: secs(rs.At), Y: float64(total) / 1000})
		}
		out = append(out, namedChart{"replicas", &chart.Chart{
			Title:  r.opts.Scenario + ": running replicas, and ConfigBindings (thousands)",
			XLabel: xl, YLabel: "replicas / thousands of objects",
			Series: []chart.Series{{Name: "replicas", Points: rp, Step: true}, {Name: "objects (k)", Points: objs}}, Markers: markers,
		}})
	}
	return out
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

// renderMarkdown writes the report a person reads.
func renderMarkdown(rep *Report) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
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
	renderCapacity(&b, rep.Capacity)
	if len(rep.Fleets) > 0 {
		renderFleets(&b, rep)
	}
	if len(rep.Events) > 0 {
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
		for _, ev := range rep.Events {
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
		if n, own := eventOwnWrites(rep.Events); n > 0 && own == 0 {
			p("\nThe load tester wrote no ConfigBinding or ConfigMap during any event whose writes were counted (%d of %d events): every write counted there is the replicas'.\n", n, len(rep.Events))
		} else if n > 0 {
			p("\nThe load tester's own ConfigBinding and ConfigMap writes during the events whose writes were counted (%d of %d events), %d in all, are subtracted.\n", n, len(rep.Events), own)
		}
	}
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
	return b.String()
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
