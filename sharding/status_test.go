package sharding_test

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/sharding"
)

// TestStatusNamesABadShardCountAnnotation: a live member Lease whose
// kshard.dev/shards annotation is no shard count (hand-edited, or written by
// something else) makes `kshard status` fail naming the Lease and the
// annotation. A negative count made it panic drawing a ring of -3 shards.
func TestStatusNamesABadShardCountAnnotation(t *testing.T) {
	t.Parallel() // own namespace and ring; it reads only them, and counts ConfigBindings
	c := newClient(t)
	ns := newNamespace(t, c)
	for _, bad := range []string{"-3", "0", "99999", "x"} {
		ring := "badcount"
		now := metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sharding.MemberLeaseName(ring, "r-0"),
				Labels:      map[string]string{sharding.LabelRing: ring, sharding.LabelLeaseKind: sharding.LeaseKindMember},
				Annotations: map[string]string{sharding.AnnotationShards: bad}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("r-0_1"), LeaseDurationSeconds: ptr.To[int32](3600),
				AcquireTime: &now, RenewTime: &now},
		}
		if err := c.Create(context.Background(), l); err != nil {
			t.Fatal(err)
		}
		_, err := sharding.ReadStatus(context.Background(), c, ns, ring, configv1alpha1.GroupVersion.WithKind("ConfigBinding"))
		want := `member Lease badcount-member-r-0: annotation kshard.dev/shards "` + bad + `" is not a shard count in [1, 4096]`
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("annotation %q: ReadStatus error %v, want one containing %q", bad, err, want)
		}
		if err := c.Delete(context.Background(), l); err != nil {
			t.Fatal(err)
		}
	}
}
