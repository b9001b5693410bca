package loadtest

import (
	"fmt"
	"slices"
	"strings"
)

// fleetRow is one row of the report's fleets table: its title, and how a
// fleet's cell reads from the fleet's result. The rows are data, so a
// figure is one line here and the table renders them all alike.
type fleetRow struct {
	title string
	cell  func(*FleetResult) string
}

// renderFleets writes the fleets side by side: one column per fleet, the
// load tester's own rows (what ran, its start and create storm) and then a
// row per query of queries/fleets.yaml, then the per-replica table.
func renderFleets(b *strings.Builder, rep *Report) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	fl := rep.Fleets
	p("\n## Fleets\n\nOne column per fleet, run one after another on the same control plane, objects and load. " +
		"Below the start and storm rows, every figure is a PromQL query against the run's Prometheus, which scraped the replicas, " +
		"the API server, its etcd, the config center and the load tester's own observations ([queries/fleets.yaml](../queries/fleets.yaml); " +
		"the JSON copy of this report has each query as evaluated). *Phase* figures are over each fleet's measured phase, *life* figures over its whole life (start, warm-up, load, settle).\n\n|  |")
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
	for i, q := range figureNames(fl) {
		if !slices.ContainsFunc(fl, func(f *FleetResult) bool { return i < len(f.Figures) && !f.Figures[i].noSpan() }) {
			continue // a span no fleet had: no start on existing objects, say
		}
		p("| %s |", mdEscape(q))
		for _, f := range fl {
			cell := noData
			if i < len(f.Figures) {
				cell = f.Figures[i].text()
			}
			p(" %s |", cell)
		}
		p("\n")
	}
	renderReplicas(b, fl)
}

// figureNames are the query rows' names, from the first fleet that has
// them (every fleet runs the same queries).
func figureNames(fl []*FleetResult) []string {
	for _, f := range fl {
		if len(f.Figures) > 0 {
			names := make([]string, len(f.Figures))
			for i, x := range f.Figures {
				names[i] = x.Name
			}
			return names
		}
	}
	return nil
}

// fleetRows are the load tester's own rows of the fleets table, in order;
// a section about something no fleet had (no objects at a start, no storm)
// is left out.
func fleetRows(rep *Report) []fleetRow {
	fl := rep.Fleets
	has := func(pred func(*FleetResult) bool) bool { return slices.ContainsFunc(fl, pred) }
	rows := identityRows()
	if has(func(f *FleetResult) bool { return f.StartObjects > 0 }) {
		rows = append(rows, startRows(fl)...)
	}
	if has(func(f *FleetResult) bool { return f.Storm.Kind != "" }) {
		rows = append(rows, stormRows(rep.Machine.Calibration)...)
	}
	return rows
}

// identityRows say what each fleet ran.
func identityRows() []fleetRow {
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
		{"measured phase", func(f *FleetResult) string { return fmtDur(f.Window) }},
		{"shard table at the fleet's start: domains labeled at CREATE", func(f *FleetResult) string {
			switch {
			case !f.Sharded:
				return "n/a (no labeler)"
			case f.ShardTableDomains < 0:
				return "none (cold)"
			}
			return fmt.Sprint(f.ShardTableDomains)
		}},
	}
}

// startRows are the fleets' starts on existing objects, timed by the load
// tester's settle (settle.go).
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
	return rows
}

// stormRows are the fleets' create storms, timed by the load tester.
func stormRows(*Calibration) []fleetRow {
	return []fleetRow{
		{"create storm", func(f *FleetResult) string { return f.Storm.describe() }},
		{"create storm: until every object Ready", func(f *FleetResult) string {
			switch {
			case f.Storm.Kind == "":
				return "—"
			case !f.Storm.Settled:
				return "not settled"
			}
			return fmtDur(f.Storm.Duration)
		}},
		{"create storm: objects Ready per second", func(f *FleetResult) string {
			if f.Storm.Kind == "" || !f.Storm.Settled || f.Storm.Duration <= 0 {
				return "—"
			}
			return fmt.Sprintf("%.1f", float64(f.Storm.Objects)/f.Storm.Duration.Seconds())
		}},
	}
}

// renderReplicas writes the per-replica table: a column per query of
// queries/fleets.yaml's replicas, a row per replica of every fleet.
func renderReplicas(b *strings.Builder, fl []*FleetResult) {
	var names []string
	for _, f := range fl {
		for _, r := range f.ReplicaFigures {
			if len(names) == 0 {
				for _, x := range r.Figures {
					names = append(names, x.Name)
				}
			}
		}
	}
	if len(names) == 0 {
		return
	}
	fmt.Fprintf(b, "\nPer replica (over each fleet's life; a restarted replica's processes together):\n\n| fleet | replica | %s |\n| --- | --- |%s\n",
		strings.Join(names, " | "), strings.Repeat(" ---: |", len(names)))
	for _, f := range fl {
		for _, r := range f.ReplicaFigures {
			fmt.Fprintf(b, "| %s | %s |", mdEscape(f.Fleet), r.Replica)
			for _, x := range r.Figures {
				fmt.Fprintf(b, " %s |", x.text())
			}
			b.WriteString("\n")
		}
	}
}

// plainFleet is the run's plain controller-runtime fleet, nil without one.
func plainFleet(fl []*FleetResult) *FleetResult {
	for _, f := range fl {
		if f.Plain {
			return f
		}
	}
	return nil
}

// code writes command-line arguments as code.
func code(args []string) string {
	if len(args) == 0 {
		return "—"
	}
	return "`" + strings.Join(args, " ") + "`"
}
