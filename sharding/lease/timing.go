package lease

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/tools/leaderelection"
)

// TimingNames are what a caller calls the three Lease durations, so
// that ValidateTiming's errors name what the user set: Options fields,
// or the flags that set them.
type TimingNames struct {
	LeaseDuration, RenewDeadline, RetryPeriod string
}

// ValidateTiming reports what makes a lease duration, renew deadline
// and retry period unusable, each named as names says. sharding.New refuses
// Options it rejects; a command validates its flags with it before anything starts,
// so that a bad pair is named instead of stopping a running replica:
//
//   - each must be positive;
//   - the lease duration must be whole seconds: a Lease stores it in
//     spec.leaseDurationSeconds, so 1.5s would be written, and honoured by
//     every other replica, as 1s, and 500ms as 0s (expired at once);
//   - renew deadline < lease duration, so that a holder that cannot renew
//     stops before anyone else may take its Lease;
//   - renew deadline > leaderelection.JitterFactor (1.2) × retry period:
//     a Lease is renewed every retry period and a late renewal needs room
//     before the deadline; and client-go's leader election, which a Single
//     runs through its manager, jitters its retries by up to that factor
//     and refuses a shorter deadline (accepted here, a pair such as 5s/6s
//     once stopped the replica when its labeler, then client-go's election,
//     started campaigning).
func ValidateTiming(leaseDuration, renewDeadline, retryPeriod time.Duration, names TimingNames) error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{names.LeaseDuration, leaseDuration}, {names.RenewDeadline, renewDeadline}, {names.RetryPeriod, retryPeriod}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %s must be positive", d.name, d.v))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if leaseDuration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("%s %s must be whole seconds: a Lease stores spec.leaseDurationSeconds, so it would be written and honoured as %s",
			names.LeaseDuration, leaseDuration, leaseDuration.Truncate(time.Second)))
	}
	if renewDeadline >= leaseDuration {
		errs = append(errs, fmt.Errorf("%s %s must be below %s %s: a holder that cannot renew must stop before anyone else may take its Lease",
			names.RenewDeadline, renewDeadline, names.LeaseDuration, leaseDuration))
	}
	if floor := time.Duration(leaderelection.JitterFactor * float64(retryPeriod)); renewDeadline <= floor {
		errs = append(errs, fmt.Errorf("%s %s must exceed %v × %s %s = %s: renewals come every retry period, jittered by up to that factor by client-go's leader election (a Single's), which refuses a shorter deadline",
			names.RenewDeadline, renewDeadline, leaderelection.JitterFactor, names.RetryPeriod, retryPeriod, floor))
	}
	return errors.Join(errs...)
}
