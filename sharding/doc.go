// Package sharding splits one controller's objects across the replicas of a
// StatefulSet by business domain, so no replica lists, watches or caches
// everything.
//
// An object's shard is a pure function of its domain (ShardOf), stamped once
// as the label kshard.dev/shard and never rewritten: scaling, rolling updates
// and crashes move shard ownership, not objects. Ownership is a Lease per
// shard (<ring>-shard-<n>). Every replica renews a member Lease
// (<ring>-member-<replica>), builds the same consistent-hash Ring from the
// live members, and acquires the shards the ring gives it when their Lease is
// free, released or expired. Shards acquired together share one cache whose
// informers select their labels (kshard.dev/shard in (…)): the API server
// scans the whole collection for every LIST, so the replica lists once per
// acquisition, not once per shard. The caches feed one controller whose
// worker count bounds concurrency whatever the number of shards.
//
// Handover is a drain: stop admitting the shard's requests, wait (bounded)
// for its in-flight reconciles, leave its cache, run OnRelease, and clear
// the Lease holder so the next owner acquires at once. A holder that cannot
// renew before its renew deadline stops the shard at once (fencing), before
// anyone else may take it. In a StatefulSet, a replica stopping for a restart
// keeps its ring position and reclaims its shards on return. Leases are held
// as "<replica>_<incarnation>", one incarnation per process, so a second
// process with an identity in use waits instead of running the same shards.
//
// One replica at a time, the holder of the ring's labeler Lease, labels
// objects whose shard label is missing or out of range (and, with a shard
// table, records their domains, so that the API server labels later objects
// of a known domain at CREATE); the holder of a shard removes an in-range
// wrong label from its objects, for the labeler to label them again. No webhook sits on the write path.
//
// Usage, from a controller's main:
//
//	rep, err := sharding.New(mgr, sharding.Options{
//		Ring: "configbinding", LeaseNamespace: "kshard-system",
//		For:    sharding.Kind{Object: &v1alpha1.ConfigBinding{}},
//		Owns:   []sharding.Kind{{Object: &corev1.ConfigMap{}}},
//		Domain: func(o client.Object) string { return o.(*v1alpha1.ConfigBinding).Spec.Domain },
//	})
//	_, err = rep.NewController("configbinding", reconciler, controller.TypedOptions[sharding.Request]{})
//
// The reconciler receives a Request with its shard, reads through
// rep.Reader(req.Shard) and asks rep.WriteContext(ctx, req.Shard) before
// each write: the hold is a time, not a flag, so a replica thawed from a
// pause longer than its renew deadline writes nothing. Program it against
// the Shards interface: Single implements it for one replica holding every
// shard (sharding off, and a stand-in in tests), with the same Requests,
// hooks and write check.
package sharding
