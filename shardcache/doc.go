// Package shardcache composes the two libraries a sharded controller with a
// slow external service needs: sharding's shard tenures drive what
// externalcache holds for each shard. The replica has one off-heap store,
// shared by the shards it holds, each shard's entries keyed by its tenure.
// A shard acquired here is added to it, and warmed with the keys its
// objects read once its informers synced; a shard released is dropped
// from it with its entries, fetches and share of the change feeds; a value
// that arrives or changes requeues the shard's objects that read it.
// Without it, every controller writes this glue itself, and gets its
// ordering wrong in ways that show only under handover: a shard added after
// its first reconcile, a warm-up that outlives the tenure, a requeue for a
// shard no longer held.
//
// Wire it in three steps, the same for a ring (sharding.New) and for one
// replica (sharding.NewSingle): create the Cache, pass its OnAcquire and
// OnRelease as the runtime's hooks, and Bind it to the runtime before the
// manager starts. Reconcilers read values with Get, which never blocks.
package shardcache
