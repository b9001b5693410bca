package loadtest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kshard/kshard/internal/controlplane"
)

// reporter turns what a run recorded into its Report: the settings it ran
// with, each fleet's figures from Prometheus, the checks against the API
// server's audit log, the replicas' audit logs and the Leases, and the
// notes; then writes it. It keeps no state of its own: the run's report is
// where the scenario and the reporter both write.
type reporter struct{ r *run }

// writeReport writes <scenario>.md and <scenario>.json into the report
// folder.
func (rp reporter) writeReport() error {
	r := rp.r
	rep := r.report
	name := r.opts.Scenario
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
	renderNotes(&b, rep)
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
	where := fmt.Sprintf("kube-apiserver %s and etcd (GOGC %s) on the same machine, every process on loopback", orUnknown(m.KubeAPIServer), orUnknown(m.ControlPlaneGOGC))
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
		"*Object writes*: the API server's mutating requests (POST, PUT, PATCH, APPLY, DELETE) on ConfigBindings and ConfigMaps, " +
		"any subresource, from the event until the first scrape after it settled, less the load tester's own (queries/fleets.yaml's events queries); " +
		"counted for events without load only (—: under load). *Config-center reads*: etcd's Range and Txn calls in the same window " +
		"(a new owner reads its domains' keys again, a domain's queued keys in one call).\n\n")
	var counted []string
	for _, ev := range events {
		if len(ev.Figures) > 0 {
			for _, x := range ev.Figures {
				counted = append(counted, x.Name)
			}
			break
		}
	}
	p("| event | at | shards moved | shards moved to another replica | objects in them | shards held after | settled after |")
	for _, c := range counted {
		p(" %s |", c)
	}
	p("\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |%s\n", strings.Repeat(" ---: |", len(counted)))
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
		p("| %s | %s | %d | %s | %d | %s | %s |", mdEscape(ev.Name), fmtDur(ev.At), ev.Moved, toOther, ev.Objects, held, reconciled)
		for i := range counted {
			cell := "—"
			if i < len(ev.Figures) {
				cell = ev.Figures[i].text()
			}
			p(" %s |", cell)
		}
		p("\n")
	}
}

// renderNotes writes the notes and the link to what every number means.
func renderNotes(b *strings.Builder, rep *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if len(rep.Notes) > 0 {
		p("\n## Notes\n\n")
		for _, n := range rep.Notes {
			p("- %s\n", mdEscape(n))
		}
		p("\n")
	}
	guide := rep.guide
	if guide == "" {
		guide = "../README.md"
	}
	p("\nWhat every number means: [loadtest/README.md](%s#what-the-numbers-mean).\n", guide)
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
	p("| fleet | capacity (updates/s) | lowest rate missed | ÷ (replicas × first fleet's per replica) | largest replica's objects ÷ mean | " +
		"replicas' CPU with no load (cores) | Lease writes per second with no load | CPU per Lease write, at most |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	per := 0.0
	if caps[0].Capacity > 0 {
		per = caps[0].Capacity / float64(caps[0].Replicas)
	}
	for _, c := range caps {
		eff := noData
		if per > 0 && c.Capacity > 0 {
			v := c.Capacity / (per * float64(c.Replicas))
			eff = fmt.Sprintf("%.2f", v)
			if v > maxLinear {
				eff += " **superlinear: the baseline is wrong**"
			}
		}
		p("| %s | %.1f | %s | %s | %.2f | %s | %s | %s |\n", mdEscape(c.Fleet), c.Capacity, orNone(c.Missed), eff, c.SharesMax, coresText(c.IdleCores),
			figureText(c.Idle, idleLeaseWrites), figureText(c.Idle, idleCPUPerWrite))
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

// figureText is the named figure in its unit, or no data.
func figureText(figs []Figure, name string) string {
	for _, x := range figs {
		if x.Name == name && x.NoData == "" {
			return unitFormats[x.Unit](x.Value)
		}
	}
	return noData
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
