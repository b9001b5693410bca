package sharding

import "github.com/cespare/xxhash/v2"

// ShardOf is the shard of a business domain: stable for a given shard count,
// whatever the members, so scaling never relabels objects. It equals
// buraksezer/consistent's FindPartitionID with the xxhash hasher.
func ShardOf(domain string, shards int32) int32 {
	return int32(xxhash.Sum64String(domain) % uint64(shards))
}
