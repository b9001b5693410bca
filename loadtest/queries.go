package loadtest

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// queryFiles are the report's queries: a file of PromQL per table.
//
//go:embed queries/*.yaml
var queryFiles embed.FS

// query is one figure of a report: a PromQL query over a span of a fleet.
type query struct {
	Name string `json:"name"`
	// Over names the span (queries/fleets.yaml lists them); the query is
	// evaluated at its end.
	Over string `json:"over"`
	Unit string `json:"unit"`
	// Query is PromQL with the variables queries/fleets.yaml lists.
	Query string `json:"query"`
	// Sharded says only a sharded fleet has the figure (its labeler, its
	// shards): n/a for the others. Cache says only a fleet whose
	// reconciles read an external cache has it.
	Sharded bool `json:"sharded,omitempty"`
	Cache   bool `json:"cache,omitempty"`
	// Authorized says only a fleet whose replicas ask SpiceDB has it.
	Authorized bool `json:"authorized,omitempty"`
}

// querySet is a queries file: the Fleets table's rows, and the columns of
// the per-replica table (each query by replica).
type querySet struct {
	Rows     []query `json:"rows"`
	Replicas []query `json:"replicas"`
	// Events are the events table's counted columns, each over the event.
	Events []query `json:"events"`
	// Windows are the capacity scenario's figures of a window of load,
	// Idle its figures of a fleet with no load before the first window.
	Windows []query `json:"windows"`
	Idle    []query `json:"idle"`
}

// Figure is one query's value for one fleet (or one replica of it).
type Figure struct {
	Name string
	Unit string
	// Query is the PromQL evaluated, its variables filled in, so a reader
	// can run it against the same data.
	Query string
	At    time.Time
	Value float64
	// NoData says why there is no value (no sample, NaN, an error); the
	// figure is then not a 0.
	NoData string `json:",omitempty"`
}

// ReplicaFigures are the per-replica table's figures of one replica.
type ReplicaFigures struct {
	Replica string
	Figures []Figure
}

// loadQueries reads every queries file of queryFiles into one set.
func loadQueries() (querySet, error) {
	var all querySet
	files, err := queryFiles.ReadDir("queries")
	if err != nil {
		return all, fmt.Errorf("reading the queries: %w", err)
	}
	for _, f := range files {
		qs, err := loadQueryFile(f.Name())
		if err != nil {
			return all, err
		}
		all.Rows = append(all.Rows, qs.Rows...)
		all.Replicas = append(all.Replicas, qs.Replicas...)
		all.Events = append(all.Events, qs.Events...)
		all.Windows = append(all.Windows, qs.Windows...)
		all.Idle = append(all.Idle, qs.Idle...)
	}
	return all, nil
}

// loadQueryFile reads one queries file of queryFiles.
func loadQueryFile(name string) (querySet, error) {
	var qs querySet
	b, err := queryFiles.ReadFile("queries/" + name)
	if err != nil {
		return qs, fmt.Errorf("reading the queries %s: %w", name, err)
	}
	if err := yaml.UnmarshalStrict(b, &qs); err != nil {
		return qs, fmt.Errorf("reading the queries %s: %w", name, err)
	}
	for _, q := range slices.Concat(qs.Rows, qs.Replicas, qs.Events, qs.Windows, qs.Idle) {
		if q.Name == "" || q.Query == "" || !slices.Contains(spanNames, q.Over) {
			return qs, fmt.Errorf("the queries %s: %q needs a name, a query and a span to be over (one of %v)", name, q.Name, spanNames)
		}
		if _, ok := unitFormats[q.Unit]; !ok {
			return qs, fmt.Errorf("the queries %s: %q has unit %q", name, q.Name, q.Unit)
		}
	}
	return qs, nil
}

// spanNames are the spans of a fleet a query can be over.
var spanNames = []string{"life", "phase", "start", "storm", "probes", "event", "window", "idle"}

// span is a stretch of a fleet's time, and the objects it concerns.
type span struct {
	from, to time.Time
	// end is when the span's end is read: the first scrape after to
	// (promServer.readEnds), or one step after to before it is known.
	end     time.Time
	objects int
}

// queryWindow is what a fleet's queries are evaluated over.
type queryWindow struct {
	fleet string
	// spans are the fleet's, by name; one it did not have is missing.
	spans map[string]span
	// step is the replicas' scrape interval; last is twice the longest
	// of any job's (promServer.readEnds sets it; 2 × step before).
	step, last           time.Duration
	memoryLimit, ceiling float64
	// sharded says the fleet is sharded (query.Sharded), cache that its
	// reconciles read an external cache (query.Cache), authorized that its
	// replicas ask SpiceDB (query.Authorized).
	sharded, cache, authorized bool
}

// expand fills in q's variables for w, and says when to evaluate it:
// false when the fleet had no such span.
func (w queryWindow) expand(q query) (string, time.Time, bool) {
	sp, ok := w.spans[q.Over]
	if !ok || !sp.to.After(sp.from) {
		return q.Query, time.Time{}, false
	}
	promDur := func(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) + "ms" }
	unix := func(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64) }
	number := func(v float64) string {
		if v <= 0 {
			return "NaN"
		}
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	// A span's end is read at the first scrape after it: what the span
	// caused is counted up to it (the load tester starts a span only after
	// a scrape of the quiet before it, see promServer.spanStart).
	end := sp.end
	if end.IsZero() {
		end = sp.to.Add(w.step)
	}
	last := w.last
	if last <= 0 {
		last = 2 * w.step
	}
	return strings.NewReplacer(
		"$delta(", "$delta(", // expanded below, with $from and $to
		"$replicas", fmt.Sprintf(`job=%q,fleet=%q`, jobReplicas, w.fleet),
		"$fleet", w.fleet,
		"$range", promDur(end.Sub(sp.from)), "$from", unix(sp.from), "$to", unix(end),
		"$step", promDur(w.step), "$last", promDur(last), "$at", unix(sp.to), "$objects", number(float64(sp.objects)),
		"$memory_limit", number(w.memoryLimit), "$ceiling", number(w.ceiling),
	).Replace(expandDelta(q.Query, unix(sp.from), unix(end))), end, true
}

// expandDelta writes out every $delta(X) of q: what the counters X added
// between from and to, 0 where none existed yet.
func expandDelta(q, from, to string) string {
	const macro = "$delta("
	for {
		i := strings.Index(q, macro)
		if i < 0 {
			return q
		}
		depth, quoted, j := 1, false, i+len(macro)
		for ; j < len(q) && depth > 0; j++ {
			switch c := q[j]; {
			case c == '"' && q[j-1] != '\\':
				quoted = !quoted
			case quoted:
			case c == '(':
				depth++
			case c == ')':
				depth--
			}
		}
		if depth > 0 {
			return q // unbalanced: Prometheus says what is wrong
		}
		x := q[i+len(macro) : j-1]
		q = q[:i] + fmt.Sprintf("((sum(%s @ %s) or vector(0)) - (sum(%s @ %s) or vector(0)))", x, to, x, from) + q[j:]
	}
}

// notApplicable says why the fleet cannot have q's figure, "" when it can:
// a labeler's figure of a fleet with sharding off, a ratio to a ceiling the
// run did not calibrate or to a memory limit the replicas did not have.
func (w queryWindow) notApplicable(q query) string {
	switch {
	case q.Sharded && !w.sharded:
		return "no ring"
	case q.Cache && !w.cache:
		return "no external cache read"
	case q.Authorized && !w.authorized:
		return "no authorization"
	case strings.Contains(q.Query, "$ceiling") && w.ceiling <= 0:
		return "not calibrated"
	case strings.Contains(q.Query, "$memory_limit") && w.memoryLimit <= 0:
		return "no memory limit"
	}
	return ""
}

// figures evaluates the rows of qs for w.
func (p *promServer) figures(ctx context.Context, qs []query, w queryWindow) []Figure {
	w = p.readEnds(ctx, w)
	out := make([]Figure, 0, len(qs))
	for _, q := range qs {
		expanded, at, ok := w.expand(q)
		f := Figure{Name: q.Name, Unit: q.Unit, Query: expanded, At: at}
		if !ok {
			f.NoData = noSpan + q.Over
			out = append(out, f)
			continue
		}
		if why := w.notApplicable(q); why != "" {
			f.NoData = notApplicable + why
			out = append(out, f)
			continue
		}
		if strings.Contains(q.Query, "$objects") && w.spans[q.Over].objects == 0 {
			f.NoData = noObjects
			out = append(out, f)
			continue
		}
		v, err := p.scalar(ctx, f.Query, at)
		switch {
		case errors.Is(err, errNoData) && p.unscraped(f.Query) != "":
			f.NoData = notScraped + p.unscraped(f.Query)
		case errors.Is(err, errNoData):
			f.NoData = "no data" + p.scrapeHealth(ctx, f.Query, w.spans[q.Over].from, at)
		case err != nil:
			f.NoData = err.Error()
		default:
			f.Value = v
		}
		out = append(out, f)
	}
	return out
}

// replicaFigures evaluates the per-replica columns of qs for w.
func (p *promServer) replicaFigures(ctx context.Context, qs []query, w queryWindow) []ReplicaFigures {
	w = p.readEnds(ctx, w)
	byReplica := map[string][]Figure{}
	for i, q := range qs {
		expanded, at, ok := w.expand(q)
		if !ok || w.notApplicable(q) != "" {
			continue
		}
		f := Figure{Name: q.Name, Unit: q.Unit, Query: expanded, At: at, NoData: "no data"}
		v, err := p.vector(ctx, f.Query, at)
		if err != nil {
			f.NoData = err.Error()
		}
		for _, s := range v {
			name := string(s.Metric[model.LabelName("replica")])
			for len(byReplica[name]) < i {
				byReplica[name] = append(byReplica[name], Figure{Name: qs[len(byReplica[name])].Name, NoData: "no data"})
			}
			g := f
			if v := float64(s.Value); math.IsNaN(v) || math.IsInf(v, 0) {
				g.NoData = "no data"
			} else {
				g.Value, g.NoData = float64(s.Value), ""
			}
			byReplica[name] = append(byReplica[name], g)
		}
	}
	out := make([]ReplicaFigures, 0, len(byReplica))
	for name, fs := range byReplica {
		for len(fs) < len(qs) {
			fs = append(fs, Figure{Name: qs[len(fs)].Name, NoData: "no data"})
		}
		out = append(out, ReplicaFigures{Replica: name, Figures: fs})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Replica < out[j].Replica })
	return out
}

// unitFormats write a figure's value in its unit.
var unitFormats = map[string]func(float64) string{
	"bytes":   formatBytes,
	"seconds": func(v float64) string { return fmtDur(time.Duration(v * float64(time.Second))) },
	"ratio":   pct,
	"count":   func(v float64) string { return strconv.FormatFloat(math.Round(v), 'f', 0, 64) },
	"rate":    func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"cores":   func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) },
	"number":  func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) },
}

// notScraped begins the NoData of a figure of a service the run's
// Prometheus does not scrape.
const notScraped = "not scraped: "

// unscraped is a job q selects that p does not scrape, "" for none.
func (p *promServer) unscraped(q string) string {
	for _, job := range p.absent {
		if strings.Contains(q, fmt.Sprintf("job=%q", job)) {
			return job
		}
	}
	return ""
}

// scrapeHealth says how the scrapes of the jobs q selects went from from
// until at, when some failed: a figure without data because Prometheus
// could not scrape its service says so, with the target's last error,
// rather than reading as a service that exported nothing.
func (p *promServer) scrapeHealth(ctx context.Context, q string, from, at time.Time) string {
	window := fmt.Sprintf("[%dms]", max(at.Sub(from).Milliseconds(), 1))
	var b strings.Builder
	for _, job := range p.static {
		if !strings.Contains(q, fmt.Sprintf("job=%q", job)) {
			continue
		}
		sel := fmt.Sprintf("up{job=%q}", job)
		tried, err := p.scalar(ctx, "sum(count_over_time("+sel+window+"))", at)
		if err != nil {
			fmt.Fprintf(&b, "; job %s: no scrape in the span", job)
			continue
		}
		ok, err := p.scalar(ctx, "sum(sum_over_time("+sel+window+"))", at)
		if err != nil || ok == tried {
			continue
		}
		fmt.Fprintf(&b, "; job %s: %.0f of %.0f scrapes in the span failed", job, tried-ok, tried)
		if targets, err := p.api.Targets(ctx); err == nil {
			for _, t := range targets.Active {
				if t.ScrapePool == job && t.LastError != "" {
					fmt.Fprintf(&b, " (last error: %s, last scrape took %.2fs)", t.LastError, t.LastScrapeDuration)
				}
			}
		}
	}
	return b.String()
}

// noSpan begins the NoData of a figure over a span the fleet did not have.
const noSpan = "the fleet had no "

// noSpan says the figure is over a span the fleet did not have.
func (f Figure) noSpan() bool { return strings.HasPrefix(f.NoData, noSpan) }

// notApplicable begins the NoData of a figure the fleet cannot have
// (queryWindow.notApplicable says why).
const notApplicable = "n/a: "

// noObjects is the NoData of a figure per object of a span that had none
// (an event that moved no shard): not a lack of data.
const noObjects = "no objects"

// text is the figure as a report shows it.
func (f Figure) text() string {
	switch {
	case f.NoData == noObjects:
		return "—"
	case strings.HasPrefix(f.NoData, notApplicable):
		return "n/a"
	case f.NoData != "":
		return "no data"
	}
	return unitFormats[f.Unit](f.Value)
}

// formatBytes writes a byte count for people: 12.3 MiB.
func formatBytes(b float64) string {
	const unit = 1024
	if b < unit {
		return strconv.FormatFloat(b, 'f', 0, 64) + " B"
	}
	div, exp := float64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", b/div, "KMGTP"[exp])
}
