package shardwrites

import (
	"fmt"
	"strings"

	"github.com/kshard/kshard/sharding"
	ringkeys "github.com/kshard/kshard/sharding/ring"
)

// Ring is the ring a fence is written for: whose replicas it fences, which
// Leases grant which shards, and which objects are in a shard. kshard's own
// is DefaultRing; a controller that embeds the sharding library fills in its
// own (`kshard fencing --ring --for --writes ...`), so that the API server
// fences its replicas as it fences kshard's.
type Ring struct {
	// Name is the ring's name (sharding.Options.Ring): its shard Leases are
	// <Name>-shard-<n>, its labeler Lease <Name>-labeler, its replicas'
	// member Leases <Name>-member-<pod>, and its policies <Name>-shard-writes
	// and so on.
	Name string
	// Namespace holds the ring's Leases and shard table, and its replicas'
	// ServiceAccount (sharding.Options.LeaseNamespace).
	Namespace string
	// ServiceAccount is the replicas' ServiceAccount in Namespace: the
	// fence applies to its tokens only.
	ServiceAccount string
	// LabelPrefix is sharding.Options.LabelPrefix: the shard label is
	// <LabelPrefix>/shard, the domain label <LabelPrefix>/domain.
	LabelPrefix string
	// Shards is the ring's shard count (sharding.Options.Shards).
	Shards int32
	// ShardTable is the labeler's shard table in Namespace
	// (sharding.Options.ShardTable), which the shard-label policy reads to
	// label an object at its creation; empty: no such policy.
	ShardTable string
	// For is the sharded kind's resource: the labeler stamps its objects'
	// shard labels.
	For Resource
	// Domain says where the shard-label policy reads a For object's domain
	// (sharding.Options.Domain): a field path under the object ("spec.domain")
	// or "label:" and a label key ("label:example.dev/team").
	Domain string
	// Writes are the resources the replicas write per object in a shard:
	// the For kind's subresources ("configbindings/status") and the kinds
	// they own, each labelled with its owner's shard.
	Writes []Resource
	// ImmutableDomain, for a label domain, refuses anyone's update that
	// changes or removes the label of an object that has it: an object
	// whose domain changes moves to another shard (correct, but a move and
	// two writes per change), and a domain that never changes is what the
	// sharding assumes. A field domain is made immutable by its CRD (kshard's
	// spec.domain: self == oldSelf).
	ImmutableDomain bool
	// LabelsOnly says the replicas change nothing of a For object but its
	// shard and domain labels (its spec, annotations, finalizers and owners
	// are its user's): a controller that writes a status subresource and
	// owned objects. Without it the holder of a For object's shard may
	// write the object itself.
	LabelsOnly bool
}

// Resource is an API group and a resource of it, with a subresource after a
// slash ("configbindings/status"); the core group is "".
type Resource struct {
	Group, Resource string
}

// ParseResource reads "resource.group" or "resource/subresource.group"
// (kubectl's form: "configbindings.config.kshard.dev",
// "configbindings/status.config.kshard.dev"; "configmaps" for the core
// group).
func ParseResource(s string) (Resource, error) {
	name, group, _ := strings.Cut(s, ".")
	if name == "" || strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/") {
		return Resource{}, fmt.Errorf("resource %q: want resource.group or resource/subresource.group", s)
	}
	return Resource{Group: group, Resource: name}, nil
}

// String is the resource in ParseResource's form.
func (r Resource) String() string {
	if r.Group == "" {
		return r.Resource
	}
	return r.Resource + "." + r.Group
}

// DefaultRing is kshard's own ring as deploy/base runs it: ConfigBindings
// sharded by spec.domain, their status, ConfigMaps and ExternalDomains
// written per shard.
func DefaultRing() Ring {
	const group = "config.kshard.dev"
	return Ring{
		Name: "kshard", Namespace: "kshard-system", ServiceAccount: "kshard",
		LabelPrefix: sharding.DefaultLabelPrefix, Shards: sharding.DefaultShards, ShardTable: "kshard-shard-table",
		For:    Resource{Group: group, Resource: "configbindings"},
		Domain: "spec.domain",
		Writes: []Resource{
			{Group: "", Resource: "configmaps"},
			{Group: group, Resource: "configbindings/status"},
			{Group: group, Resource: "externaldomains"},
			{Group: group, Resource: "externaldomains/status"},
		},
		LabelsOnly: true,
	}
}

// Validate says what is missing or wrong in r.
func (r Ring) Validate() error {
	switch {
	case r.Name == "" || r.Namespace == "" || r.ServiceAccount == "" || r.LabelPrefix == "":
		return fmt.Errorf("a ring needs a name, a namespace, a ServiceAccount and a label prefix")
	case r.Shards < 1 || r.Shards > 4096:
		return fmt.Errorf("shards must be in [1, 4096], got %d", r.Shards)
	case r.For.Resource == "" || strings.Contains(r.For.Resource, "/"):
		return fmt.Errorf("the sharded kind's resource %q is not a resource", r.For.Resource)
	case r.ShardTable != "" && r.domainPresent() == "":
		return fmt.Errorf("domain %q: want a field path (spec.domain) or label:<key>", r.Domain)
	case r.ImmutableDomain && r.domainLabel() == "":
		return fmt.Errorf("an immutable domain is a label domain's (label:<key>); a field's is its CRD's rule")
	}
	for _, w := range r.Writes {
		if w.Resource == "" {
			return fmt.Errorf("a written resource has no name")
		}
	}
	return nil
}

// keys are the ring's labels.
func (r Ring) keys() ringkeys.Keys { return ringkeys.KeysFor(r.LabelPrefix) }

// policy names one of the ring's policies.
func (r Ring) policy(what string) string { return r.Name + "-" + what }

// username is the replicas' user name, as the API server authenticates
// their ServiceAccount tokens.
func (r Ring) username() string {
	return fmt.Sprintf("system:serviceaccount:%s:%s", r.Namespace, r.ServiceAccount)
}

// domainLabel is the label key of a label domain, "" for a field.
func (r Ring) domainLabel() string {
	key, ok := strings.CutPrefix(r.Domain, "label:")
	if !ok {
		return ""
	}
	return key
}

// domainPresent is the CEL test that a For object has its domain, and
// domainValue the CEL expression of it.
func (r Ring) domainPresent() string {
	if key := r.domainLabel(); key != "" {
		return fmt.Sprintf("has(object.metadata.labels) && %s in object.metadata.labels", celString(key))
	}
	path := strings.Split(r.Domain, ".")
	for _, p := range path {
		if !isIdentifier(p) {
			return ""
		}
	}
	return "has(object." + r.Domain + ")"
}

func (r Ring) domainValue() string {
	if key := r.domainLabel(); key != "" {
		return fmt.Sprintf("object.metadata.labels[%s]", celString(key))
	}
	return "object." + r.Domain
}

// isIdentifier says s may be a step of a CEL field path.
func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// celString quotes s as a CEL string literal.
func celString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
