package configbinding

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// fencedMessage begins the message of deploy/base's kshard-shard-writes
// policy when it refuses a write: the API server no longer sees this pod as
// the holder of the shard's Lease.
const fencedMessage = "kshard fencing:"

// leaselessMessage is in the API server's refusal of a write to a shard
// whose Lease does not exist (deploy/base's bindings fail closed): it
// answers 422, with no word of the policy's own.
const leaselessMessage = "no params found for policy binding with `Deny` parameterNotFoundAction"

// fencedWrites counts the writes the API server refused because this
// replica did not hold the shard's Lease when they arrived: late writes the
// replica's own check (WriteContext) let go before the Lease moved. Each is
// a write that would otherwise have landed beside the new holder's.
var fencedWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kshard_fenced_writes_total",
	Help: "Writes the API server refused because this replica's pod did not hold the shard's Lease when they arrived (deploy/base's kshard-shard-writes policy), by resource.",
}, []string{"resource"})

func init() { metrics.Registry.MustRegister(fencedWrites) }

// fenced reports whether err is the fencing policy's refusal, and counts it.
// Such a write needs no condition: the shard has moved, and its new holder
// writes the binding.
func fenced(resource string, err error) bool {
	fence := apierrors.IsForbidden(err) && strings.Contains(err.Error(), fencedMessage)
	leaseless := apierrors.IsInvalid(err) && strings.Contains(err.Error(), leaselessMessage)
	if !fence && !leaseless {
		return false
	}
	fencedWrites.WithLabelValues(resource).Inc()
	return true
}
