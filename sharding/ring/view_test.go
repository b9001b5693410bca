package ring

import (
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding/lease"
)

// TestShardCountVoteDeterministic reads the same member Leases many times:
// five live members announcing three shard counts, the oldest member's
// count with one vote and the two others tied at two. The ring's count is
// the tied count whose oldest member is the oldest, at every read. Before
// the vote walked the members in age order, ties between counts other than
// the oldest member's were settled by map order: 1,000 reads of such Leases
// gave one count 867 times and another 133, and replicas flipped in and out
// of the ring.
func TestShardCountVoteDeterministic(t *testing.T) {
	keys := KeysFor("kshard.dev")
	now := time.Now()
	member := func(name string, shards int, age time.Duration) coordinationv1.Lease {
		return coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:              lease.MemberName("kshard", name),
				CreationTimestamp: metav1.NewTime(now.Add(-age)),
				Labels:            map[string]string{keys.Ring: "kshard", keys.LeaseKind: lease.KindMember},
				Annotations:       map[string]string{keys.Shards: fmt.Sprint(shards)},
			},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name + "_1"), LeaseDurationSeconds: ptr.To[int32](15),
				RenewTime: ptr.To(metav1.NewMicroTime(now))},
		}
	}
	for _, tc := range []struct {
		name    string
		members []coordinationv1.Lease
		want    int32
	}{
		{"tie between the counts other than the oldest member's", []coordinationv1.Lease{
			member("a", 64, 5*time.Hour), // the oldest, alone with its count
			member("b", 32, 3*time.Hour), // 32's oldest member, older than 128's
			member("c", 128, 2*time.Hour),
			member("d", 128, time.Hour),
			member("e", 32, time.Minute),
		}, 32},
		{"the same, the other count older", []coordinationv1.Lease{
			member("a", 64, 5*time.Hour),
			member("b", 32, time.Hour),
			member("c", 128, 4*time.Hour),
			member("d", 128, 2*time.Minute),
			member("e", 32, time.Minute),
		}, 128},
		{"tie with the oldest member's count", []coordinationv1.Lease{
			member("a", 64, 5*time.Hour),
			member("b", 32, 4*time.Hour),
			member("c", 32, 3*time.Hour),
			member("d", 64, time.Hour),
		}, 64},
		{"a majority over the oldest member", []coordinationv1.Lease{
			member("a", 64, 5*time.Hour),
			member("b", 32, 4*time.Hour),
			member("c", 32, 3*time.Hour),
		}, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[int32]int{}
			for range 1000 {
				v := Read(keys, "kshard", tc.members, 64, now, func(l *coordinationv1.Lease) time.Time {
					return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
				})
				got[v.ShardCount]++
			}
			if len(got) != 1 || got[tc.want] != 1000 {
				t.Errorf("1,000 reads of the same Leases gave shard counts %v, want %d every time", got, tc.want)
			}
		})
	}
}
