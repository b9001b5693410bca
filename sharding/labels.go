package sharding

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kshard/kshard/sharding/ring"
)

// DefaultLabelPrefix prefixes the label and annotation keys a ring writes,
// unless Options.LabelPrefix names another: a controller built on this
// package marks its objects and Leases under its own domain.
const DefaultLabelPrefix = "kshard.dev"

// The label and annotation keys under DefaultLabelPrefix. Shard labels live
// on the objects; ring labels and annotations live on the Leases that
// coordinate replicas.
const (
	// LabelShard holds an object's shard number. Informers select on it, so
	// a replica lists and watches only the shards it holds.
	LabelShard = DefaultLabelPrefix + "/shard"
	// LabelDomain holds the business domain the shard was computed from, so
	// a person can see why an object landed where it did.
	LabelDomain = DefaultLabelPrefix + "/domain"
	// LabelRing marks the Leases of one ring, so replicas watch only those,
	// and the cluster-scoped objects a ring's replicas write, which another
	// ring's shards of the same number must leave alone.
	LabelRing = DefaultLabelPrefix + "/ring"
	// LabelLeaseKind tells member Leases from shard Leases (lease.KindMember,
	// lease.KindShard).
	LabelLeaseKind = DefaultLabelPrefix + "/lease-kind"
	// AnnotationShards is the shard count a member was started with. Members
	// that disagree with the ring claim nothing.
	AnnotationShards = DefaultLabelPrefix + "/shards"
)

// labelKeys are the label and annotation keys of one ring: LabelShard and
// the others, under the ring's prefix, with what the runtime does with them.
type labelKeys struct{ ring.Keys }

func newLabelKeys(prefix string) labelKeys { return labelKeys{ring.KeysFor(prefix)} }

// validateLabelPrefix refuses a prefix that would not make label keys: it
// must be a DNS subdomain (the prefix part of a qualified name).
func validateLabelPrefix(prefix string) error {
	if errs := validation.IsDNS1123Subdomain(prefix); len(errs) > 0 {
		return fmt.Errorf("label prefix %q: %s", prefix, strings.Join(errs, "; "))
	}
	return nil
}

// owned are the labels an owned object carries so the shard caches see it:
// its owner's shard and domain.
func (k labelKeys) owned(shard int32, domain string) map[string]string {
	return map[string]string{k.Shard: strconv.Itoa(int(shard)), k.Domain: domain}
}

// shardSelector selects objects whose shard label is (selection.In) or is
// not (selection.NotIn) one of shards.
func (k labelKeys) shardSelector(op selection.Operator, shards ...int32) (labels.Selector, error) {
	values := make([]string, len(shards))
	for i, n := range shards {
		values[i] = strconv.Itoa(int(n))
	}
	req, err := labels.NewRequirement(k.Shard, op, values)
	if err != nil {
		return nil, fmt.Errorf("selecting shard label %s %s %v: %w", k.Shard, op, shards, err)
	}
	return labels.NewSelector().Add(*req), nil
}
