// Package promtext reads the values the sandbox and the load tester need
// from a replica's /metrics (the Prometheus text format), so both read
// series the same way.
package promtext

import (
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Parse reads a scrape into its metric families, by name.
func Parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return families, nil
}

// Sum adds up a family's series; a missing family sums to zero, as a
// counter nobody incremented yet.
func Sum(f *dto.MetricFamily) float64 {
	var total float64
	for _, m := range f.GetMetric() {
		total += Value(m)
	}
	return total
}

// Value is a counter's, gauge's or untyped series' value (0 for others).
func Value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// Label is a series' label value, "" when it has none of that name.
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
