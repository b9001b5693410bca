package loadtest

import (
	"strings"
	"testing"
)

// TestRenderFigures: the fleets table shows each query's figure in its
// unit, "no data" where a query found none (never a 0), and leaves out a
// row over a span no fleet had.
func TestRenderFigures(t *testing.T) {
	fig := func(name, unit string, v float64, noData string) Figure {
		return Figure{Name: name, Unit: unit, Value: v, NoData: noData}
	}
	rep := &Report{Machine: Machine{CPUs: 2}, Fleets: []*FleetResult{
		{Fleet: "sharded ×2", Figures: []Figure{
			fig("heap peak", "bytes", 3<<20, ""),
			fig("end-to-end p99", "seconds", 0.25, ""),
			fig("fleet start: writes", "count", 0, noSpan+"start"),
			fig("hit ratio", "ratio", 0.5, ""),
		}},
		{Fleet: "plain controller-runtime ×1", Plain: true, Figures: []Figure{
			fig("heap peak", "bytes", 0, "no data"),
			fig("end-to-end p99", "seconds", 1.5, ""),
			fig("fleet start: writes", "count", 0, noSpan+"start"),
			fig("hit ratio", "ratio", 0, notScraped+"configcenter"),
		}},
	}}
	var b strings.Builder
	renderFleets(&b, rep)
	md := b.String()
	for _, want := range []string{
		"| heap peak | 3.0 MiB | no data |",
		"| end-to-end p99 | 250 ms | 1.50 s |",
		"| hit ratio | 50.0 % | no data |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the table lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "fleet start: writes") {
		t.Errorf("a row over a span no fleet had is shown:\n%s", md)
	}
}
