package loadtest

import (
	"strings"
	"testing"
	"time"
)

func TestOptionsDefaultsPerScenario(t *testing.T) {
	o := Options{Scenario: "handover", Out: t.TempDir()}
	if err := o.setDefaults(scenarios["handover"]); err != nil {
		t.Fatal(err)
	}
	if o.Objects != 10000 || o.Replicas != 3 || o.LeaseDuration != 15*time.Second || o.SettleTimeout != 10*time.Minute {
		t.Errorf("handover defaults: %d objects, %d replicas, lease %s, settle %s", o.Objects, o.Replicas, o.LeaseDuration, o.SettleTimeout)
	}
	if o.CalibrateFor != 5*time.Second {
		t.Errorf("calibration %s, want 5s by default", o.CalibrateFor)
	}
	// A negative calibration time (the flag's 0) stays off.
	o = Options{Scenario: "basic", CalibrateFor: -1, Out: t.TempDir()}
	if err := o.setDefaults(scenarios["basic"]); err != nil || o.CalibrateFor >= 0 {
		t.Errorf("calibration %s (%v), want it left off", o.CalibrateFor, err)
	}
	// A value the caller set wins over the scenario's default.
	o = Options{Scenario: "handover", Objects: 500, Out: t.TempDir()}
	if err := o.setDefaults(scenarios["handover"]); err != nil {
		t.Fatal(err)
	}
	if o.Objects != 500 {
		t.Errorf("objects %d, want the caller's 500", o.Objects)
	}
	o = Options{Scenario: "external-outage", Out: t.TempDir()}
	if err := o.setDefaults(scenarios["external-outage"]); err != nil {
		t.Fatal(err)
	}
	if o.OutageAfter != 30*time.Second || o.OutageFor != 30*time.Second {
		t.Errorf("outage %s after, for %s; want the middle third of 90s", o.OutageAfter, o.OutageFor)
	}
	// A scenario's rate in all holds with the load tester's default
	// object count, and with the caller's.
	for _, objects := range []int{0, 400} {
		o = Options{Scenario: "authorization", Objects: objects, Out: t.TempDir()}
		if err := o.setDefaults(scenarios["authorization"]); err != nil {
			t.Fatal(err)
		}
		if got := o.UpdateRate * float64(o.Objects); got < 99.99 || got > 100.01 {
			t.Errorf("authorization with %d objects: %v updates/s, want its 100", o.Objects, got)
		}
	}
}

func TestOptionsRejectBadInput(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Objects: -1}, "objects -1"},
		{Options{KeysPerDomain: 2, KeysPerObject: 2}, "must exceed keys per object"},
		{Options{Skew: "pareto"}, `skew "pareto"`},
		{Options{Skew: SkewZipf, ZipfS: 0.5}, "zipf exponent 0.5"},
		{Options{LeaseDuration: 1500 * time.Millisecond}, "whole seconds"},
		{Options{LeaseDuration: 10 * time.Second, RenewDeadline: 10 * time.Second}, "renew deadline"},
		{Options{RenewDeadline: 6 * time.Second, RetryPeriod: 5 * time.Second}, "renew deadline 6s must exceed 1.2 × retry period 5s"},
		{Options{ErrorRate: 2}, "error rate 2"},
		{Options{ConfigCenter: "zookeeper"}, `config center "zookeeper"`},
		{Options{Jitter: time.Millisecond}, "need the stand-in config center"},
		{Options{ErrorRate: 0.1}, "need the stand-in config center"},
		{Options{Duration: time.Minute, OutageAfter: 50 * time.Second, OutageFor: 20 * time.Second}, "must end within the duration"},
		{Options{CalibrateFor: time.Hour}, "calibration time 1h0m0s"},
	} {
		o := tc.o
		o.Scenario, o.Out = "basic", t.TempDir()
		err := o.setDefaults(scenarios["basic"])
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one saying %q", tc.o, err, tc.want)
		}
	}
}

func TestModeSharded(t *testing.T) {
	for _, tc := range []struct {
		m    Mode
		want bool
	}{
		{ModeSharded, true}, {ModeSingleton, false}, {ModeDirect, true},
		{Mode{Name: "x", Args: []string{"--sharding", "off"}}, false},
		{Mode{Name: "mirror", Args: []string{"--external-source=mirror"}}, true},
	} {
		if got := tc.m.Sharded(); got != tc.want {
			t.Errorf("%s %v: Sharded() = %v", tc.m.Name, tc.m.Args, got)
		}
	}
}

// TestModeReadsCache: only a fleet whose reconciles look values up in the
// external cache has a hit ratio; the mirror's reconciles read
// ExternalDomains, the direct mode's call the config center.
func TestModeReadsCache(t *testing.T) {
	for _, tc := range []struct {
		m    Mode
		want bool
	}{
		{ModeCache, true}, {ModeSharded, true}, {ModeMirror, false}, {ModeDirect, false}, {ModePlain, false},
		{Mode{Name: "x", Args: []string{"--external-source", "mirror"}}, false},
	} {
		if got := tc.m.readsCache(); got != tc.want {
			t.Errorf("%s %v: readsCache() = %v", tc.m.Name, tc.m.Args, got)
		}
	}
}
