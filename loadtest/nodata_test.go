package loadtest

import (
	"strings"
	"testing"
	"time"
)

// TestChecksWithoutDataFail: a check with nothing to decide on fails as
// "no data" instead of passing vacuously, and the report says so in its
// result cell; a check about something the run did not have passes as n/a.
func TestChecksWithoutDataFail(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	noData := map[string]Check{
		"ready":      readyCheck(0, 0, nil),
		"unowned":    unownedCheck(nil, 0, 20*time.Second, t0, nil),
		"events":     eventsCheck(nil, 5*time.Minute),
		"reconciles": (&AuditSummary{Processes: 3}).reconcileCheck(""),
		"writes":     (*WriteEvidence)(nil).check(""),
		"memory":     memoryCheck([]*FleetResult{{Fleet: "sharded ×3"}}, 512<<20, nil),
	}
	rep := &Report{Scenario: "basic"}
	for name, c := range noData {
		if c.Passed || !c.NoData || !strings.HasPrefix(c.Detail, "no data: ") {
			t.Errorf("%s without data: %+v, want a failure saying no data", name, c)
		}
		rep.Checks = append(rep.Checks, c)
	}
	if c := noData["memory"]; !strings.Contains(c.Detail, "sharded ×3") {
		t.Errorf("memory check %q: want the fleet without a measurement named", c.Detail)
	}
	md := renderMarkdown(rep)
	for _, c := range rep.Checks {
		if want := "| " + mdEscape(c.Name) + " | **FAIL** (no data) | no data: "; !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(md, "| pass |") {
		t.Error("a check without data reported as passed")
	}

	// With data they decide as before.
	for name, c := range map[string]Check{
		"ready":      readyCheck(0, 10, nil),
		"unowned":    unownedCheck(nil, 50, 20*time.Second, t0, nil),
		"events":     eventsCheck([]EventResult{{Name: "start of sharded ×3"}}, 5*time.Minute),
		"reconciles": (&AuditSummary{Records: 20, Processes: 3, Objects: 10}).reconcileCheck(""),
	} {
		if !c.Passed || c.NoData {
			t.Errorf("%s with data: %+v, want a pass", name, c)
		}
	}
	if c := readyCheck(1, 10, []string{"ns/x"}); c.Passed || c.NoData {
		t.Errorf("one object not Ready: %+v, want a failure on data", c)
	}

	na := memoryCheck([]*FleetResult{{Fleet: "plain controller-runtime ×1", Plain: true}}, 512<<20, nil)
	if !na.Passed || !na.NotApplicable || na.result() != "n/a" {
		t.Errorf("no memory limit: %+v (%s), want n/a", na, na.result())
	}
}
