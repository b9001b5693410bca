package replica

import (
	"strings"
	"testing"
	"time"

	"github.com/kshard/kshard/externalcache/etcdsource"
)

// TestOptionsRefuseUnusableLeaseTiming: the replica refuses, before it
// starts, a Lease timing that a Lease would truncate or that the labeler's
// (or, without sharding, the manager's) leader election refuses, naming the
// flag. 1.5s used to be written as 1s, and --retry-period 5s with
// --renew-deadline 6s stopped the replica once it campaigned.
func TestOptionsRefuseUnusableLeaseTiming(t *testing.T) {
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		sharding            bool
		want                string
	}{
		{1500 * time.Millisecond, time.Second, 500 * time.Millisecond, true, "--lease-duration 1.5s must be whole seconds"},
		{15 * time.Second, 6 * time.Second, 5 * time.Second, true, "--renew-deadline 6s must exceed 1.2 × --retry-period 5s"},
		{15 * time.Second, 6 * time.Second, 5 * time.Second, false, "--renew-deadline 6s must exceed 1.2 × --retry-period 5s"},
	} {
		o := Options{Etcd: etcdsource.ClientOptions{Servers: []string{"http://127.0.0.1:1"}}, Identity: "kshard-0", Sharding: tc.sharding,
			LeaseDuration: tc.lease, RenewDeadline: tc.renew, RetryPeriod: tc.retry}
		if err := o.setDefaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s/%s/%s (sharding %v): error %v, want one containing %q", tc.lease, tc.renew, tc.retry, tc.sharding, err, tc.want)
		}
	}
	o := Options{Etcd: etcdsource.ClientOptions{Servers: []string{"http://127.0.0.1:1"}}, Identity: "kshard-0", Sharding: true}
	if err := o.setDefaults(); err != nil {
		t.Errorf("the default timing refused: %v", err)
	}
}
