package ring

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/sharding/lease"
)

// Status is a ring as the cluster shows it: who holds each shard, who
// should, and which shards nobody runs. `kshard status` prints it.
type Status struct {
	Ring       string
	ShardCount int32
	Members    []MemberStatus
	Shards     []ShardStatus
	// Unowned are shards with no live holder: their objects are not being
	// reconciled.
	Unowned []int32
	// Unlabeled counts primary objects with no valid shard label.
	Unlabeled int
}

// MemberStatus is one member Lease.
type MemberStatus struct {
	Name       string
	Live       bool
	ShardCount int32
	Held       int
	Desired    int
	RenewAge   time.Duration
}

// ShardStatus is one shard.
type ShardStatus struct {
	Shard    int32
	Holder   string
	Desired  string
	LeaseAge time.Duration // since acquisition by the current holder
	Objects  int
}

// StatusOptions name the ring ReadStatus reads, as its replicas' Options
// (package sharding) do.
type StatusOptions struct {
	// Namespace holds the ring's Leases (Options.LeaseNamespace).
	Namespace string
	// Ring names the ring (Options.Ring).
	Ring string
	// Kind is the ring's primary kind, whose objects are counted per shard.
	Kind schema.GroupVersionKind
	// LabelPrefix is the ring's (Options.LabelPrefix; its default is
	// sharding.DefaultLabelPrefix). Required.
	LabelPrefix string
}

// ReadStatus reads a ring's Leases and counts its primary objects per shard
// label (metadata only, paginated).
func ReadStatus(ctx context.Context, c client.Reader, opts StatusOptions) (*Status, error) {
	if opts.LabelPrefix == "" {
		return nil, fmt.Errorf("reading ring %s: no label prefix", opts.Ring)
	}
	keys, ring := KeysFor(opts.LabelPrefix), opts.Ring
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.InNamespace(opts.Namespace), client.MatchingLabels{keys.Ring: ring}); err != nil {
		return nil, fmt.Errorf("listing Leases of ring %s: %w", ring, err)
	}
	now := time.Now()
	view := Read(keys, ring, leases.Items, MaxShards, now, func(l *coordinationv1.Lease) time.Time { return leaseExpiry(l.Spec) })
	if len(view.Invalid) > 0 {
		// Hand-edited or written by something else: the ring cannot be
		// drawn without knowing whether that member is in it.
		return nil, fmt.Errorf("reading ring %s: %w", ring, errors.Join(view.Invalid...))
	}
	st := &Status{Ring: ring, ShardCount: view.ShardCount}
	if st.ShardCount == 0 {
		// No live member: take the largest shard Lease number seen.
		for n := range view.Shards {
			st.ShardCount = max(st.ShardCount, n+1)
		}
	}
	counts, unlabeled, err := countObjects(ctx, c, keys, opts.Kind, st.ShardCount)
	if err != nil {
		return nil, err
	}
	st.Unlabeled = unlabeled
	r := New(st.ShardCount, view.Members)
	held := map[string]int{}
	for n := range st.ShardCount {
		s := ShardStatus{Shard: n, Desired: r.Owner(n), Objects: counts[n]}
		if l, ok := view.Shards[n]; ok && l.Live(now) {
			s.Holder = lease.HolderReplica(l.Holder)
			held[s.Holder]++
		} else {
			st.Unowned = append(st.Unowned, n)
		}
		st.Shards = append(st.Shards, s)
	}
	for _, l := range leases.Items {
		switch l.Labels[keys.LeaseKind] {
		case lease.KindShard:
			if n, ok := lease.ParseShardName(ring, l.Name, st.ShardCount); ok && st.Shards[n].Holder != "" && l.Spec.AcquireTime != nil {
				st.Shards[n].LeaseAge = now.Sub(l.Spec.AcquireTime.Time)
			}
		case lease.KindMember:
			replica, _ := lease.ParseMemberName(ring, l.Name)
			name := lease.HolderReplica(ptr.Deref(l.Spec.HolderIdentity, replica))
			count, _ := keys.memberShardCount(&l) // 0 for an expired member's bad annotation
			m := MemberStatus{Name: name, ShardCount: count, Held: held[name], Desired: len(r.ShardsOf(name))}
			m.Live = leaseExpiry(l.Spec).After(now) && ptr.Deref(l.Spec.HolderIdentity, "") != ""
			if l.Spec.RenewTime != nil {
				m.RenewAge = now.Sub(l.Spec.RenewTime.Time)
			}
			st.Members = append(st.Members, m)
		}
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].Name < st.Members[j].Name })
	return st, nil
}

func countObjects(ctx context.Context, c client.Reader, keys Keys, gvk schema.GroupVersionKind, shards int32) (map[int32]int, int, error) {
	counts := map[int32]int{}
	unlabeled := 0
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	for {
		if err := c.List(ctx, list, client.Limit(500), client.Continue(list.Continue)); err != nil {
			return nil, 0, fmt.Errorf("counting %s per shard: %w", gvk.Kind, err)
		}
		for _, o := range list.Items {
			if n, ok := keys.ShardLabel(o.Labels, shards); ok {
				counts[n]++
			} else {
				unlabeled++
			}
		}
		if list.Continue == "" {
			return counts, unlabeled, nil
		}
	}
}
