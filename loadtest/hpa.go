package loadtest

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
)

// The autoscale scenario runs the Kubernetes HPA algorithm in process,
// against the replicas' live metrics, with the HPA shipped in
// deploy/autoscaling: there is no kube-controller-manager on the load
// tester's control plane, and a real HPA would need Prometheus and an
// adapter besides. The algorithm follows the HPA controller
// (k8s.io/kubernetes/pkg/controller/podautoscaler): the replica ratio with
// its tolerance, the stabilization windows, and the rate policies.

// hpaTolerance is the HPA controller's default: a ratio within 10 % of 1
// changes nothing.
const hpaTolerance = 0.1

// adapterMetrics maps the custom-metric names the shipped autoscaling
// manifests expose to what a replica's /metrics serves: the adapter rule of
// deploy/autoscaling/prometheus-adapter-rules.yaml sums kshard_shard_objects
// per pod into kshard_objects_held. A name not listed here is read from the
// replicas' /metrics as it is, summed over its series.
var adapterMetrics = map[string]string{
	"kshard_objects_held": "kshard_shard_objects",
}

// hpaPolicy is one scaling policy: at most Value pods (or Value percent)
// added or removed per Period.
type hpaPolicy struct {
	Percent bool
	Value   int32
	Period  time.Duration
}

// hpaRules are the scaling rules of one direction.
type hpaRules struct {
	Window   time.Duration
	Policies []hpaPolicy
	// Select is Max, Min or Disabled.
	Select autoscalingv2.ScalingPolicySelect
}

// hpaSpec is what the load tester uses of a HorizontalPodAutoscaler.
type hpaSpec struct {
	Source                   string // the file it was read from
	MinReplicas, MaxReplicas int32
	// Metric is the Pods metric's name, and ReplicaMetric the family of a
	// replica's /metrics it is computed from (summed per replica).
	Metric, ReplicaMetric string
	// Target is the metric's target average value per pod.
	Target   float64
	Up, Down hpaRules
}

// readHPA reads the first HorizontalPodAutoscaler of a YAML file.
func readHPA(path string) (*hpaSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the HPA: %w", err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var h autoscalingv2.HorizontalPodAutoscaler
		if err := dec.Decode(&h); errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("no HorizontalPodAutoscaler in %s", path)
		} else if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", path, err)
		}
		if h.Kind == "HorizontalPodAutoscaler" {
			spec, err := hpaFrom(&h)
			if err != nil {
				return nil, fmt.Errorf("HPA %s in %s: %w", h.Name, path, err)
			}
			spec.Source = path
			return spec, nil
		}
	}
}

// hpaFrom takes the HPA's first Pods metric with an AverageValue target
// and its behaviour, with the API's defaults for what it leaves out.
func hpaFrom(h *autoscalingv2.HorizontalPodAutoscaler) (*hpaSpec, error) {
	s := &hpaSpec{MinReplicas: ptr.Deref(h.Spec.MinReplicas, 1), MaxReplicas: h.Spec.MaxReplicas}
	for _, m := range h.Spec.Metrics {
		if m.Type == autoscalingv2.PodsMetricSourceType && m.Pods != nil && m.Pods.Target.AverageValue != nil {
			s.Metric = m.Pods.Metric.Name
			s.Target = m.Pods.Target.AverageValue.AsApproximateFloat64()
			break
		}
	}
	if s.Metric == "" {
		return nil, errors.New("it has no Pods metric with an AverageValue target, the only kind the load tester computes")
	}
	s.ReplicaMetric = s.Metric
	if m, ok := adapterMetrics[s.Metric]; ok {
		s.ReplicaMetric = m
	}
	if s.Target <= 0 {
		return nil, fmt.Errorf("target average value %v of %s must be positive", s.Target, s.Metric)
	}
	if s.MinReplicas < 1 || s.MaxReplicas < s.MinReplicas {
		return nil, fmt.Errorf("replicas %d..%d: need 1 ≤ min ≤ max", s.MinReplicas, s.MaxReplicas)
	}
	var up, down *autoscalingv2.HPAScalingRules
	if b := h.Spec.Behavior; b != nil {
		up, down = b.ScaleUp, b.ScaleDown
	}
	s.Up = rulesFrom(up, 0, []hpaPolicy{{Percent: true, Value: 100, Period: 15 * time.Second}, {Value: 4, Period: 15 * time.Second}})
	s.Down = rulesFrom(down, 300*time.Second, []hpaPolicy{{Percent: true, Value: 100, Period: 15 * time.Second}})
	return s, nil
}

// rulesFrom applies the defaults of the autoscaling/v2 API to one direction.
func rulesFrom(r *autoscalingv2.HPAScalingRules, window time.Duration, policies []hpaPolicy) hpaRules {
	out := hpaRules{Window: window, Policies: policies, Select: autoscalingv2.MaxChangePolicySelect}
	if r == nil {
		return out
	}
	if r.StabilizationWindowSeconds != nil {
		out.Window = time.Duration(*r.StabilizationWindowSeconds) * time.Second
	}
	if r.SelectPolicy != nil {
		out.Select = *r.SelectPolicy
	}
	if len(r.Policies) > 0 {
		out.Policies = nil
		for _, p := range r.Policies {
			out.Policies = append(out.Policies, hpaPolicy{Percent: p.Type == autoscalingv2.PercentScalingPolicy, Value: p.Value, Period: time.Duration(p.PeriodSeconds) * time.Second})
		}
	}
	return out
}

// scaled returns the spec with every window and policy period multiplied by
// factor, so that a run of minutes shows what takes an HPA tens of minutes.
func (s hpaSpec) scaled(factor float64) hpaSpec {
	scale := func(d time.Duration) time.Duration { return time.Duration(float64(d) * factor) }
	for _, r := range []*hpaRules{&s.Up, &s.Down} {
		r.Window = scale(r.Window)
		ps := make([]hpaPolicy, len(r.Policies))
		for i, p := range r.Policies {
			p.Period = scale(p.Period)
			ps[i] = p
		}
		r.Policies = ps
	}
	return s
}

// desiredReplicas is the HPA formula for an average-value target:
// ceil(current × average / target), or current when the ratio is within
// the tolerance.
func desiredReplicas(current int32, average, target float64) int32 {
	ratio := average / target
	if math.Abs(ratio-1) <= hpaTolerance {
		return current
	}
	return int32(math.Ceil(float64(current) * ratio))
}

// autoscaler is the HPA controller's state for one target: past
// recommendations (for stabilization) and past scale events (for the rate
// policies).
type autoscaler struct {
	spec   hpaSpec
	recs   []timedReplicas
	events []scaleEvent
}

type timedReplicas struct {
	at       time.Time
	replicas int32
}

type scaleEvent struct {
	at    time.Time
	delta int32 // positive up, negative down
}

func newAutoscaler(spec hpaSpec) *autoscaler { return &autoscaler{spec: spec} }

// decide returns the replica count the HPA sets at now, given the current
// count and the metric's average over the current replicas, and records
// the decision.
func (a *autoscaler) decide(now time.Time, current int32, average float64) int32 {
	rec := desiredReplicas(current, average, a.spec.Target)
	stable := a.stabilize(now, current, rec)
	next := a.limit(now, current, stable)
	next = min(max(next, a.spec.MinReplicas), a.spec.MaxReplicas)
	if next != current {
		a.events = append(a.events, scaleEvent{at: now, delta: next - current})
	}
	return next
}

// stabilize applies the windows: scale up only to the lowest recommendation
// of the up window, down only to the highest of the down window.
func (a *autoscaler) stabilize(now time.Time, current, rec int32) int32 {
	up, down := rec, rec
	upCut, downCut := now.Add(-a.spec.Up.Window), now.Add(-a.spec.Down.Window)
	kept := a.recs[:0]
	for _, r := range a.recs {
		if r.at.After(upCut) {
			up = min(up, r.replicas)
		}
		if r.at.After(downCut) {
			down = max(down, r.replicas)
		}
		if r.at.After(upCut) || r.at.After(downCut) {
			kept = append(kept, r)
		}
	}
	a.recs = append(kept, timedReplicas{at: now, replicas: rec})
	out := current
	if out < up {
		out = up
	}
	if out > down {
		out = down
	}
	return out
}

// limit applies the rate policies of the direction of change.
func (a *autoscaler) limit(now time.Time, current, want int32) int32 {
	switch {
	case want > current:
		if a.spec.Up.Select == autoscalingv2.DisabledPolicySelect {
			return current
		}
		bound := int32(math.MinInt32)
		if a.spec.Up.Select == autoscalingv2.MinChangePolicySelect {
			bound = math.MaxInt32
		}
		for _, p := range a.spec.Up.Policies {
			start := current - a.changed(now, p.Period, true)
			l := start + p.Value
			if p.Percent {
				l = int32(math.Ceil(float64(start) * (1 + float64(p.Value)/100)))
			}
			bound = pick(a.spec.Up.Select, bound, l)
		}
		return min(want, bound)
	case want < current:
		if a.spec.Down.Select == autoscalingv2.DisabledPolicySelect {
			return current
		}
		bound := int32(math.MaxInt32)
		if a.spec.Down.Select == autoscalingv2.MinChangePolicySelect {
			bound = math.MinInt32
		}
		for _, p := range a.spec.Down.Policies {
			start := current + a.changed(now, p.Period, false)
			l := start - p.Value
			if p.Percent {
				l = int32(math.Ceil(float64(start) * (1 - float64(p.Value)/100)))
			}
			// Max change scaling down is the lowest bound.
			bound = pick(flip(a.spec.Down.Select), bound, l)
		}
		return max(want, bound)
	}
	return current
}

// changed sums the replicas added (up) or removed (down) within the period
// before now.
func (a *autoscaler) changed(now time.Time, period time.Duration, up bool) int32 {
	var n int32
	for _, e := range a.events {
		if !e.at.After(now.Add(-period)) {
			continue
		}
		if up && e.delta > 0 {
			n += e.delta
		}
		if !up && e.delta < 0 {
			n -= e.delta
		}
	}
	return n
}

func pick(sel autoscalingv2.ScalingPolicySelect, a, b int32) int32 {
	if sel == autoscalingv2.MinChangePolicySelect {
		return min(a, b)
	}
	return max(a, b)
}

func flip(sel autoscalingv2.ScalingPolicySelect) autoscalingv2.ScalingPolicySelect {
	if sel == autoscalingv2.MinChangePolicySelect {
		return autoscalingv2.MaxChangePolicySelect
	}
	return autoscalingv2.MinChangePolicySelect
}
