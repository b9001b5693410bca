package sharding

import (
	"time"
)

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
