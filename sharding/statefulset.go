package sharding

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// intent is what a terminating replica does with its place in the ring.
type intent string

const (
	// intentLeave hands every shard over and leaves the ring: the replica is
	// going away (scale-down, or no StatefulSet to say otherwise).
	intentLeave intent = "leave"
	// intentRestart releases the shards but keeps the member Lease, so the
	// ring does not change and the same replica reclaims its shards when it
	// returns, instead of moving them away and back (a rolling update).
	intentRestart intent = "restart"
)

// intentOf decides from StatefulSet facts: a pod whose ordinal is
// below the desired replica count will be recreated under the same name, so
// it is restarting; one at or above it is being scaled away. A StatefulSet
// being deleted, or an identity that is not "<statefulset>-<ordinal>", leaves.
func intentOf(identity, statefulSet string, desiredReplicas int32, deleting bool) intent {
	if deleting || statefulSet == "" {
		return intentLeave
	}
	suffix, ok := strings.CutPrefix(identity, statefulSet+"-")
	if !ok {
		return intentLeave
	}
	ordinal, err := strconv.ParseInt(suffix, 10, 32)
	if err != nil || ordinal < 0 || strconv.FormatInt(ordinal, 10) != suffix {
		return intentLeave
	}
	if int32(ordinal) < desiredReplicas {
		return intentRestart
	}
	return intentLeave
}

// statefulSet reads the configured StatefulSet and its desired replicas
// (1 when unset, as the API defaults it).
func (e *env) statefulSet(ctx context.Context) (*appsv1.StatefulSet, int32, error) {
	var sts appsv1.StatefulSet
	if err := e.apiReader.Get(ctx, client.ObjectKey{Namespace: e.opts.LeaseNamespace, Name: e.opts.StatefulSet}, &sts); err != nil {
		return nil, 0, fmt.Errorf("reading StatefulSet %s: %w", e.opts.StatefulSet, err)
	}
	return &sts, ptr.Deref(sts.Spec.Replicas, 1), nil
}

// terminationIntent reads the StatefulSet. Any doubt (no StatefulSet
// configured, an API error) means leave: handing over costs a move, while a
// wrong restart leaves shards unowned until the member Lease expires.
func (e *env) terminationIntent(ctx context.Context) intent {
	if leave, _ := e.leaving(ctx); leave {
		return intentLeave
	}
	return intentRestart
}

// leaving reads the StatefulSet, as terminationIntent does, and says
// whether this replica leaves the ring and which members stay in it: those
// of the StatefulSet below its desired count, and any member not named as
// one of its pods. Without a StatefulSet every other member stays.
func (e *env) leaving(ctx context.Context) (leave bool, stays func(member string) bool) {
	all := func(string) bool { return true }
	if e.opts.StatefulSet == "" {
		return true, all
	}
	sts, desired, err := e.statefulSet(ctx)
	if err != nil {
		e.log.Error(err, "Deciding between restart and leave; leaving")
		return true, all
	}
	deleting := sts.DeletionTimestamp != nil
	if intentOf(e.opts.Identity, sts.Name, desired, deleting) != intentLeave {
		return false, nil
	}
	return true, func(m string) bool {
		_, pod := strings.CutPrefix(m, sts.Name+"-")
		return !pod || intentOf(m, sts.Name, desired, deleting) == intentRestart
	}
}

// expectedMembers names the StatefulSet's desired replicas
// ("<statefulset>-<ordinal>"), so that replicas starting together build the
// final ring from the start instead of each claiming what the members seen
// so far would give it and handing most of it over moments later. Without a
// StatefulSet, or when it cannot be read, only live members count.
func (e *env) expectedMembers(ctx context.Context) []string {
	if e.opts.StatefulSet == "" || e.opts.StartupGrace < 0 {
		return nil
	}
	sts, desired, err := e.statefulSet(ctx)
	if err != nil {
		e.log.Error(err, "Building the ring from live members only")
		return nil
	}
	out := make([]string, desired)
	for i := range out {
		out[i] = sts.Name + "-" + strconv.Itoa(i)
	}
	e.log.Info("Expecting the StatefulSet's replicas in the ring", "members", len(out), "grace", e.opts.StartupGrace)
	return out
}
