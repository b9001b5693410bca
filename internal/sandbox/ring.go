package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/ring"
)

// conditionReady is the ConfigBinding condition the controller keeps.
const (
	conditionReady  = "Ready"
	reasonForbidden = "Forbidden"
)

// readRing reads the ring as the cluster shows it, the same way `kshard
// status` does: the sandbox judges the replicas only by what they wrote.
func readRing(ctx context.Context, c client.Reader) (*ring.Status, error) {
	return ring.ReadStatus(ctx, c, ring.StatusOptions{Namespace: LeaseNamespace, Ring: Ring, Kind: configv1alpha1.GroupVersion.WithKind("ConfigBinding"), LabelPrefix: sharding.DefaultLabelPrefix})
}

// listBindings reads every ConfigBinding, a page at a time.
func listBindings(ctx context.Context, c client.Reader) ([]configv1alpha1.ConfigBinding, error) {
	var out []configv1alpha1.ConfigBinding
	var list configv1alpha1.ConfigBindingList
	for {
		if err := c.List(ctx, &list, client.Limit(500), client.Continue(list.Continue)); err != nil {
			return nil, fmt.Errorf("listing ConfigBindings: %w", err)
		}
		out = append(out, list.Items...)
		if list.Continue == "" {
			return out, nil
		}
	}
}

func isReady(cb *configv1alpha1.ConfigBinding) bool {
	return meta.IsStatusConditionTrue(cb.Status.Conditions, conditionReady)
}

// forbidden reports whether the binding says Forbidden for its generation.
func forbidden(cb *configv1alpha1.ConfigBinding) bool {
	c := meta.FindStatusCondition(cb.Status.Conditions, conditionReady)
	return c != nil && c.Reason == reasonForbidden && cb.Status.ObservedGeneration == cb.Generation
}

// settled reports whether every ConfigBinding is labeled and Ready for its
// current generation (Forbidden, in namespace Ungranted). A binding names no replica (a handover rewrites no
// object), so the new holders' side of a handover is their readiness: see
// script.settled. detail says what is missing.
func settled(bindings []configv1alpha1.ConfigBinding) (ok bool, detail string) {
	var behind []string
	for i := range bindings {
		cb := &bindings[i]
		why := ""
		switch {
		case cb.Labels[sharding.LabelShard] == "":
			why = "no shard label yet"
		case cb.Namespace == Ungranted && forbidden(cb):
			// As it should be: SpiceDB grants it nothing.
		case !isReady(cb) || cb.Status.ObservedGeneration != cb.Generation:
			why = "not Ready"
			if c := meta.FindStatusCondition(cb.Status.Conditions, conditionReady); c != nil {
				why += " (" + c.Reason + ")"
			}
		}
		if why != "" {
			behind = append(behind, cb.Name+": "+why)
		}
	}
	if len(behind) == 0 {
		return true, ""
	}
	return false, fmt.Sprintf("%d of %d ConfigBindings not settled, e.g. %s", len(behind), len(bindings), behind[0])
}

// balanced reports whether every shard is held by a live replica and by the
// one the ring says should hold it: the end of any handover. detail says
// what is missing.
func balanced(st *ring.Status) (ok bool, detail string) {
	if st.ShardCount == 0 {
		return false, "no live ring member yet"
	}
	if len(st.Unowned) > 0 {
		return false, fmt.Sprintf("%d shards unowned: %s", len(st.Unowned), ranges(st.Unowned))
	}
	var wrong []int32
	for _, s := range st.Shards {
		if s.Holder != s.Desired {
			wrong = append(wrong, s.Shard)
		}
	}
	if len(wrong) > 0 {
		s := st.Shards[wrong[0]]
		return false, fmt.Sprintf("%d shards not held by their desired owner, e.g. shard %d held by %s, desired %s",
			len(wrong), s.Shard, s.Holder, s.Desired)
	}
	return true, ""
}

// liveMember reports whether a replica has a live member Lease.
func liveMember(st *ring.Status, id string) bool {
	for _, m := range st.Members {
		if m.Name == id && m.Live {
			return true
		}
	}
	return false
}

// holders maps each shard to its live holder ("" for none).
func holders(st *ring.Status) map[int32]string {
	out := make(map[int32]string, len(st.Shards))
	for _, s := range st.Shards {
		out[s.Shard] = s.Holder
	}
	return out
}

// shardMap prints which replica holds which shards, with their objects.
func shardMap(st *ring.Status) string {
	type row struct {
		shards  []int32
		objects int
	}
	rows := map[string]*row{}
	for _, s := range st.Shards {
		h := s.Holder
		if h == "" {
			h = "<unowned>"
		}
		if rows[h] == nil {
			rows[h] = &row{}
		}
		rows[h].shards = append(rows[h].shards, s.Shard)
		rows[h].objects += s.Objects
	}
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	sort.Strings(names)
	var live int
	for _, m := range st.Members {
		if m.Live {
			live++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "  shard map: %d shards, %d live members\n", st.ShardCount, live)
	for _, n := range names {
		r := rows[n]
		fmt.Fprintf(&b, "    %-10s %3d shards %5d objects   %s\n", n, len(r.shards), r.objects, ranges(r.shards))
	}
	return strings.TrimRight(b.String(), "\n")
}

// moves says which shards changed holder between two ring readings, and
// how many objects moved with them.
func moves(before, after *ring.Status) string {
	was := holders(before)
	count := map[string]int{}
	var shards, objects int
	for _, s := range after.Shards {
		from := was[s.Shard]
		if from == s.Holder {
			continue
		}
		shards++
		objects += s.Objects
		count[fmt.Sprintf("%s -> %s", orNone(from), orNone(s.Holder))]++
	}
	if shards == 0 {
		return "  no shard moved"
	}
	pairs := make([]string, 0, len(count))
	for p, n := range count {
		pairs = append(pairs, fmt.Sprintf("%s: %d", p, n))
	}
	sort.Strings(pairs)
	return fmt.Sprintf("  moved %d shards with %d objects (%s)", shards, objects, strings.Join(pairs, ", "))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// ranges writes sorted shard numbers compactly: 0-3,7,9-12.
func ranges(shards []int32) string {
	s := append([]int32(nil), shards...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var parts []string
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", s[i], s[j]))
		} else {
			parts = append(parts, fmt.Sprint(s[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
