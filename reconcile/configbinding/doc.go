// Package configbinding is kshard's reference controller: it copies keys of
// one business domain from the config center into a ConfigMap, per
// ConfigBinding. It shows the shape any sharded controller with a slow
// external dependency can copy:
//
//   - requests carry their shard; objects are read from that shard's cache,
//     and the shard is re-checked before every write;
//   - external values come from a non-blocking cache: a value on its way
//     writes nothing (the object is requeued when the key arrives, never in
//     a hot loop), a missing key or an outage is a condition with a reason
//     (KeyNotFound, ExternalUnavailable);
//   - the ConfigMap is written with server-side apply only when it drifted,
//     status with a patch guarded by resourceVersion, never a full Update;
//   - "gone from my cache" is never treated as deleted: the owner reference
//     lets the garbage collector delete the ConfigMap.
package configbinding
