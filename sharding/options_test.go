package sharding

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// timingOptions are valid Options but for their Lease timing.
func timingOptions(lease, renew, retry time.Duration) Options {
	return Options{Ring: "r", Identity: "r-0", LeaseNamespace: "ns",
		For:           Kind{Object: &corev1.ConfigMap{}},
		Domain:        func(client.Object) string { return "" },
		LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry}
}

// TestOptionsRefuseUnusableLeaseTiming: a lease duration that a Lease's
// whole-second field would truncate, and a renew deadline that client-go's
// leader election refuses (a Single's), are refused by New with the field
// named. Both were accepted: 1500ms was written as 1s and 500ms as 0s
// (expired at once), and 5s/6s stopped the replica when its labeler started.
func TestOptionsRefuseUnusableLeaseTiming(t *testing.T) {
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		want                string // in the error; "" for valid
	}{
		{15 * time.Second, 10 * time.Second, 5 * time.Second, ""},
		{6 * time.Second, 4 * time.Second, time.Second, ""},
		{2 * time.Second, 1500 * time.Millisecond, time.Second, ""},
		{1500 * time.Millisecond, time.Second, 500 * time.Millisecond, "LeaseDuration 1.5s must be whole seconds"},
		{500 * time.Millisecond, 300 * time.Millisecond, 100 * time.Millisecond, "LeaseDuration 500ms must be whole seconds: a Lease stores spec.leaseDurationSeconds, so it would be written and honoured as 0s"},
		{15 * time.Second, 6 * time.Second, 5 * time.Second, "RenewDeadline 6s must exceed 1.2 × RetryPeriod 5s = 6s"},
		{15 * time.Second, 5500 * time.Millisecond, 5 * time.Second, "RenewDeadline 5.5s must exceed 1.2 × RetryPeriod 5s"},
		{10 * time.Second, 10 * time.Second, 5 * time.Second, "RenewDeadline 10s must be below LeaseDuration 10s"},
		{10 * time.Second, 4 * time.Second, -time.Second, "RetryPeriod -1s must be positive"},
	} {
		o := timingOptions(tc.lease, tc.renew, tc.retry)
		err := o.setDefaults(logr.Discard())
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s/%s/%s refused: %v", tc.lease, tc.renew, tc.retry, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s/%s/%s: error %v, want one containing %q", tc.lease, tc.renew, tc.retry, err, tc.want)
		}
	}
}

// TestAcceptedTimingRunsLeaderElection: every Lease timing Options accept
// is one client-go's leader election, which a Single runs through its
// manager, accepts too, so no accepted timing stops a running replica.
func TestAcceptedTimingRunsLeaderElection(t *testing.T) {
	lock := &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r-labeler"},
		LockConfig: resourcelock.ResourceLockConfig{Identity: "r-0_1"}}
	steps := []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second, 1200 * time.Millisecond,
		2 * time.Second, 4 * time.Second, 5 * time.Second, 5500 * time.Millisecond, 6 * time.Second, 6001 * time.Millisecond,
		7 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second}
	accepted := 0
	for _, lease := range steps {
		for _, renew := range steps {
			for _, retry := range steps {
				o := timingOptions(lease, renew, retry)
				if o.setDefaults(logr.Discard()) != nil {
					continue
				}
				accepted++
				_, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
					Lock: lock, LeaseDuration: lease, RenewDeadline: renew, RetryPeriod: retry,
					Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}},
				})
				if err != nil {
					t.Errorf("Options accept %s/%s/%s, client-go's leader election refuses it: %v", lease, renew, retry, err)
				}
			}
		}
	}
	if accepted == 0 {
		t.Fatal("no timing accepted")
	}
}

// TestOptionsRefuseBadPrefixes: a label prefix must be a
// DNS subdomain, the prefix part of a label key (otherwise every label the
// ring writes would be refused by the API server, one object at a time),
// and a metrics prefix the start of a metric name (otherwise registering
// the metrics would panic).
func TestOptionsRefuseBadPrefixes(t *testing.T) {
	for prefix, ok := range map[string]bool{"": true, "kshard.dev": true, "pricing.example.dev": true,
		"Pricing.example.dev": false, "pricing/example": false, "pricing_example": false} {
		o := timingOptions(15*time.Second, 10*time.Second, 2*time.Second)
		o.LabelPrefix = prefix
		err := o.setDefaults(logr.Discard())
		if (err == nil) != ok || err != nil && !strings.Contains(err.Error(), "label prefix") {
			t.Errorf("LabelPrefix %q: error %v, want accepted: %v", prefix, err, ok)
		}
	}
	for prefix, ok := range map[string]bool{"": true, "kshard": true, "pricing_v2": true, "pricing-v2": false, "2pricing": false} {
		o := timingOptions(15*time.Second, 10*time.Second, 2*time.Second)
		o.MetricsPrefix = prefix
		err := o.setDefaults(logr.Discard())
		if (err == nil) != ok || err != nil && !strings.Contains(err.Error(), "metrics prefix") {
			t.Errorf("MetricsPrefix %q: error %v, want accepted: %v", prefix, err, ok)
		}
	}
}
