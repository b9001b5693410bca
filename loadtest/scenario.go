package loadtest

import (
	"cmp"
	"context"
	"embed"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// scenarioFiles are the scenarios, a file each: what runs (the fleets and
// the steps, which are the load and the faults), the defaults it brings,
// and whether its checks gate the exit code. The figures are the queries
// files' (queries/), the checks every run's (result.go).
//
//go:embed scenarios/*.yaml
var scenarioFiles embed.FS

// scenario is one named run, read from scenarios/<name>.yaml.
type scenario struct {
	name string
	// Doc says what the scenario does, for the report and the help.
	Doc string `json:"doc"`
	// Gate makes the checks decide the exit code.
	Gate bool `json:"gate,omitempty"`
	// Faults says the scenario injects the chaos faults, so their options
	// are validated.
	Faults bool `json:"faults,omitempty"`
	// SplitKeys reserves half of every domain's keys for a later phase
	// (keys no object read before).
	SplitKeys bool `json:"splitKeys,omitempty"`
	// NoLoad says the scenario runs no continuous update load.
	NoLoad bool `json:"noLoad,omitempty"`
	// Pods says the scenario runs on a StatefulSet's pods too
	// (Options.StatefulSet): one sharded fleet, no process-only fault.
	Pods bool `json:"pods,omitempty"`
	// Defaults are the scenario's own defaults, by Options field name, set
	// where the caller left the field zero, before the load tester's.
	Defaults map[string]any `json:"defaults,omitempty"`
	// UpdatesPerSecond is the default spec-update rate in all, whatever
	// the object count (it sets Options.UpdateRate); 0 for the load
	// tester's default rate per object.
	UpdatesPerSecond float64 `json:"updatesPerSecond,omitempty"`
	// OutageThird makes the config-center outage the middle third of the
	// measured phase, unless Options.OutageFor is set.
	OutageThird bool `json:"outageThird,omitempty"`
	// Fleets are the columns of a comparison, as Options.Fleets writes them
	// (mode:replicas[:cold], or a mode alone for Options.Replicas of it),
	// in the order they run; --fleets replaces them.
	Fleets []string `json:"fleets,omitempty"`
	// Steps are what runs, in order: a step name and its argument
	// (steps.go lists them).
	Steps []string `json:"steps"`

	defaults Options
}

// scenarios are the scenarios by name.
var scenarios = func() map[string]*scenario {
	m, err := loadScenarios()
	if err != nil {
		panic(err) // embedded files: TestScenariosLoad reads them first
	}
	return m
}()

// loadScenarios reads every scenario file.
func loadScenarios() (map[string]*scenario, error) {
	files, err := scenarioFiles.ReadDir("scenarios")
	if err != nil {
		return nil, fmt.Errorf("reading the scenarios: %w", err)
	}
	m := map[string]*scenario{}
	for _, f := range files {
		name := strings.TrimSuffix(f.Name(), ".yaml")
		b, err := scenarioFiles.ReadFile("scenarios/" + f.Name())
		if err != nil {
			return nil, fmt.Errorf("reading scenario %s: %w", name, err)
		}
		sc := &scenario{name: name}
		if err := yaml.UnmarshalStrict(b, sc); err != nil {
			return nil, fmt.Errorf("reading scenario %s: %w", name, err)
		}
		if err := sc.check(); err != nil {
			return nil, fmt.Errorf("scenario %s: %w", name, err)
		}
		m[name] = sc
	}
	return m, nil
}

// check parses the defaults and the fleets, and refuses an unknown step.
func (sc *scenario) check() error {
	if sc.Doc == "" || len(sc.Steps) == 0 {
		return fmt.Errorf("a scenario needs a doc and steps")
	}
	for _, name := range slices.Sorted(maps.Keys(sc.Defaults)) {
		if err := setOption(&sc.defaults, name, fmt.Sprint(sc.Defaults[name])); err != nil {
			return err
		}
	}
	if _, err := sc.fleets(1); err != nil {
		return err
	}
	for _, s := range sc.Steps {
		name, _, _ := strings.Cut(s, " ")
		if _, ok := steps[name]; !ok {
			return fmt.Errorf("step %q: the steps are %s", s, strings.Join(slices.Sorted(maps.Keys(steps)), ", "))
		}
	}
	return nil
}

// setOption sets the field of o named name from its text.
func setOption(o *Options, name, value string) error {
	f := reflect.ValueOf(o).Elem().FieldByName(name)
	if !f.IsValid() || !f.CanSet() {
		return fmt.Errorf("default %s: Options has no such field", name)
	}
	var err error
	switch f.Interface().(type) {
	case time.Duration:
		var d time.Duration
		d, err = time.ParseDuration(value)
		f.SetInt(int64(d))
	case string:
		f.SetString(value)
	case bool:
		var b bool
		b, err = strconv.ParseBool(value)
		f.SetBool(b)
	case int, int32, int64:
		var n int64
		n, err = strconv.ParseInt(value, 10, 64)
		f.SetInt(n)
	case uint64:
		var n uint64
		n, err = strconv.ParseUint(value, 10, 64)
		f.SetUint(n)
	case float64:
		var v float64
		v, err = strconv.ParseFloat(value, 64)
		f.SetFloat(v)
	default:
		return fmt.Errorf("default %s: a %s cannot be set from a scenario", name, f.Type())
	}
	if err != nil {
		return fmt.Errorf("default %s: %w", name, err)
	}
	return nil
}

// derive sets the defaults that follow from other options.
// It runs before the load tester's defaults fill the rest, so an object
// count left to them is theirs.
func (sc *scenario) derive(o *Options) {
	if objects := cmp.Or(o.Objects, defaultOptions.Objects); sc.UpdatesPerSecond > 0 && o.UpdateRate == 0 && objects > 0 {
		o.UpdateRate = sc.UpdatesPerSecond / float64(objects)
	}
	if sc.OutageThird && o.OutageFor == 0 {
		o.OutageAfter, o.OutageFor = o.Duration/3, o.Duration/3
	}
}

// fleets are the scenario's comparison columns, a mode alone with
// replicas of them.
func (sc *scenario) fleets(replicas int) ([]fleetSpec, error) {
	items := make([]string, len(sc.Fleets))
	for i, s := range sc.Fleets {
		if !strings.Contains(s, ":") {
			s += ":" + strconv.Itoa(replicas)
		}
		items[i] = s
	}
	return parseFleets(strings.Join(items, ","))
}

// compares says the scenario compares fleets, whose list --fleets may
// replace.
func (sc *scenario) compares() bool { return len(sc.Fleets) > 0 }

// plain says the scenario runs a fleet of a plain mode, so the run builds
// cmd/plaincontroller (or finds it in --bin-dir).
func (sc *scenario) plain() bool {
	specs, _ := sc.fleets(1)
	return hasPlain(specs)
}

// ScenarioInfo names and describes a scenario, for help texts.
type ScenarioInfo struct {
	Name, Doc string
	// Defaults are the options the scenario sets itself where the caller
	// left them zero, as "Field=value": the flag help cannot list them
	// all in one line.
	Defaults []string
}

// Scenarios lists the scenarios, sorted by name.
func Scenarios() []ScenarioInfo {
	out := make([]ScenarioInfo, 0, len(scenarios))
	for _, s := range scenarios {
		info := ScenarioInfo{Name: s.name, Doc: s.Doc}
		for _, k := range slices.Sorted(maps.Keys(s.Defaults)) {
			info.Defaults = append(info.Defaults, fmt.Sprintf("%s=%v", k, s.Defaults[k]))
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// fleetSpec is one column of a comparison.
type fleetSpec struct {
	Mode     Mode
	Replicas int
	// ColdTable deletes the labeler's shard table before the fleet starts,
	// so that its create storm is labeled by the labeler, not at admission
	// (what a storm of domains the cluster has never seen costs).
	ColdTable bool
}

// hasPlain says whether a list of fleets includes a plain mode.
func hasPlain(specs []fleetSpec) bool {
	return slices.ContainsFunc(specs, func(s fleetSpec) bool { return s.Mode.Plain })
}

// hasAuthorized says whether a fleet of specs asks SpiceDB.
func hasAuthorized(specs []fleetSpec) bool {
	return slices.ContainsFunc(specs, func(s fleetSpec) bool { return s.Mode.authorized() })
}

// step is one step of a scenario: arg is the text after its name.
type step func(ctx context.Context, r *run, arg string) error

// steps are what a scenario's Steps may name.
var steps = map[string]step{
	// start [mode [replicas]]: a fleet starts (default sharded, --replicas)
	// and settles; the steps after it act on it.
	"start": stepStart,
	// create: the objects are created; with a fleet running, they are its
	// create storm, awaited until every one is Ready.
	"create": func(ctx context.Context, r *run, _ string) error { return r.createAll(ctx, r.fleets.running()) },
	// load [action]: spec updates for the duration (the measured phase),
	// while the action runs: scale-out, rolling-restart, outage, chaos.
	"load": stepLoad,
	// end: the final settle, and the fleet stops.
	"end": func(ctx context.Context, r *run, _ string) error { return r.endFleet(ctx, r.fleets.running()) },
	// resync-storms: every object updated at once, then every replica
	// restarted at once, each timed until every object is Ready again.
	"resync-storms": func(ctx context.Context, r *run, _ string) error { return resyncStorms(ctx, r, r.fleets.running()) },
	// handovers: a graceful leave, a join, a crash and a rejoin with no
	// load, each settled before the next.
	"handovers": func(ctx context.Context, r *run, _ string) error {
		f := r.fleets.running()
		if f.size() < 2 {
			return fmt.Errorf("handovers need at least 2 replicas, not %d", f.size())
		}
		r.beginLoad(ctx, f)
		if err := quietHandovers(ctx, r, f); err != nil {
			return err
		}
		r.endLoad(ctx, f)
		return nil
	},
	// compare: the scenario's fleets one after another on the same objects
	// and load.
	"compare": func(ctx context.Context, r *run, _ string) error { return compareFleets(ctx, r, r.chosen) },
	// capacity: each fleet's highest update rate within the objectives.
	"capacity": func(ctx context.Context, r *run, _ string) error { return runCapacity(ctx, r) },
	// scale: the scale scenario's fleets, starts, loads and handovers.
	"scale": func(ctx context.Context, r *run, _ string) error { return runScale(ctx, r) },
}

// stepStart starts a fleet: "start", "start off", "start sharded 1".
func stepStart(ctx context.Context, r *run, arg string) error {
	mode, n := ModeSharded, r.opts.Replicas
	if name, count, _ := strings.Cut(arg, " "); name != "" {
		m, ok := fleetModes[name]
		if !ok {
			return fmt.Errorf("start %s: no such mode", arg)
		}
		mode = m
		if count != "" {
			var err error
			if n, err = strconv.Atoi(count); err != nil {
				return fmt.Errorf("start %s: %w", arg, err)
			}
		}
	}
	_, err := r.startFleet(ctx, mode, n)
	return err
}

// stepLoad runs the measured phase on the current fleet with an action.
func stepLoad(ctx context.Context, r *run, action string) error {
	f := r.fleets.running()
	acts := map[string]func(context.Context, *run, *fleet) error{
		"": nil, "scale-out": scaleOut, "rolling-restart": rollingRestart, "outage": outageUnderLoad,
		"chaos": func(ctx context.Context, r *run, f *fleet) error { return r.faults.run(ctx, f) },
	}
	act, ok := acts[action]
	if !ok {
		return fmt.Errorf("load %s: the actions are scale-out, rolling-restart, outage and chaos", action)
	}
	var during func(context.Context) error
	if act != nil {
		during = func(ctx context.Context) error { return act(ctx, r, f) }
	}
	return r.withLoad(ctx, f, r.opts.Duration, during)
}

// runSteps runs the scenario's steps in order.
func (r *run) runSteps(ctx context.Context) error {
	for _, s := range r.sc.Steps {
		name, arg, _ := strings.Cut(s, " ")
		if name != "start" && name != "create" && name != "compare" && name != "capacity" && name != "scale" && r.fleets.running() == nil {
			return fmt.Errorf("step %q: no fleet runs (a start step comes first)", s)
		}
		if err := steps[name](ctx, r, arg); err != nil {
			return err
		}
	}
	return nil
}
