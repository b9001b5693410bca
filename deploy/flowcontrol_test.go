package deploy_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/promtext"
)

// TestSyncsAndLeasesHaveTheirOwnPriorityLevels: with deploy/base's
// FlowSchemas, the API server dispatches the replicas' LISTs and WATCHes of
// what they cache in the kshard-syncs priority level, and their Lease
// requests in kshard-leases (a relist queued, or a write storm, must not
// delay a renewal). It reads the API server's own count of the requests
// each FlowSchema dispatched.
func TestSyncsAndLeasesHaveTheirOwnPriorityLevels(t *testing.T) {
	ctx := context.Background()
	c := adminClient(t)
	ns := installBase(ctx, t, c)
	schema, leases := "kshard-syncs-"+ns, "kshard-leases-"+ns
	sa := tokenClient(t, serviceAccountToken(ctx, t, ns, "kshard"))

	// The API server applies new FlowSchemas asynchronously: request until
	// both dispatch.
	getLease := func() {
		var l coordinationv1.Lease
		// Whether it exists does not matter: the API server classifies a
		// request before it authorizes or serves it.
		_ = sa.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kshard-shard-0"}, &l)
	}
	controlplane.Eventually(t, time.Minute, "a ConfigBinding LIST dispatched by "+schema+" and a Lease GET by "+leases, func() error {
		if err := sa.List(ctx, &configv1alpha1.ConfigBindingList{}); err != nil {
			return err
		}
		getLease()
		if n := dispatched(ctx, t, schema); n < 1 {
			return fmt.Errorf("%s dispatched %.0f requests", schema, n)
		}
		if n := dispatched(ctx, t, leases); n < 1 {
			return fmt.Errorf("%s dispatched %.0f requests", leases, n)
		}
		return nil
	})
	before := dispatched(ctx, t, schema)
	// (ExternalDomains are the mirror component's, whose RBAC base lacks.)
	lists := []client.ObjectList{&configv1alpha1.ConfigBindingList{}, &corev1.ConfigMapList{}}
	for _, l := range lists {
		if err := sa.List(ctx, l); err != nil {
			t.Fatalf("listing %T as the ServiceAccount: %v", l, err)
		}
	}
	afterLists := dispatched(ctx, t, schema)
	if got := afterLists - before; got != float64(len(lists)) {
		t.Errorf("%d LISTs of cached kinds: %s dispatched %.0f, want all of them", len(lists), schema, got)
	}
	const leaseRequests = 5
	leasesBefore := dispatched(ctx, t, leases)
	for range leaseRequests {
		getLease()
	}
	if got := dispatched(ctx, t, schema) - afterLists; got != 0 {
		t.Errorf("%d Lease GETs: %s dispatched %.0f of them, want none", leaseRequests, schema, got)
	}
	if got := dispatched(ctx, t, leases) - leasesBefore; got != leaseRequests {
		t.Errorf("%d Lease GETs: %s dispatched %.0f of them, want all", leaseRequests, leases, got)
	}
}

// dispatched reads how many requests the API server dispatched under a
// FlowSchema of the same name as its priority level.
func dispatched(ctx context.Context, t *testing.T, flowSchema string) float64 {
	t.Helper()
	return apiServerCount(ctx, t, "apiserver_flowcontrol_dispatched_requests_total", func(m *dto.Metric) bool {
		return promtext.Label(m, "flow_schema") == flowSchema && promtext.Label(m, "priority_level") == flowSchema
	})
}
