package sharding

import (
	"strings"
	"time"
)

// parseShardLeaseName is the inverse of ShardLeaseName.
func parseShardLeaseName(name string, shards int32) (int32, bool) {
	v, ok := strings.CutPrefix(name, "kshard-shard-")
	if !ok {
		return 0, false
	}
	return parseShard(v, shards)
}

// acquirable says whether this replica may try to take a shard Lease now,
// and why: it does not exist yet, it was released, it expired, or it is
// already ours (a restarted replica reclaiming its shards).
func acquirable(l *shardLease, identity string, now time.Time) (string, bool) {
	switch {
	case l == nil:
		return "created", true
	case l.holder == "":
		return "released", true
	case l.holder == identity:
		return "reclaimed", true
	case !now.Before(l.expiry):
		return "expired", true
	}
	return "", false
}
