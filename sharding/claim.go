package sharding

import (
	"time"
)

// acquirable says whether this process may try to take a shard Lease now,
// and why: it does not exist yet, it was released, it expired, or it is
// already this process's (held by its holder identity, incarnation
// included: a shard fenced here and wanted again). Another incarnation of
// the same replica is another holder: its Lease is taken only once expired.
func acquirable(l *shardLease, holder string, now time.Time) (string, bool) {
	switch {
	case l == nil:
		return "created", true
	case l.holder == "":
		return "released", true
	case l.holder == holder:
		return "reclaimed", true
	case !now.Before(l.expiry):
		return "expired", true
	}
	return "", false
}
