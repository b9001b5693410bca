package configbinding_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// TestFullFetchQueueIsNoOutage: a replica's start asks for every key of its
// objects at once, and a fetch queue that is full turns some away. That is
// the replica's own back-pressure, not the config center failing: no
// binding may say ExternalUnavailable for it, and every binding becomes
// Ready once the queue has room. Here the queue holds one key and the
// config center answers in 300 ms, so most of the sixteen bindings, each
// reading its own key, find it full. (Before the fix they said "config
// center unavailable (fetching …: fetch queue full)"; at 100,000 objects the
// scale scenario saw thousands of Ready bindings say so.)
func TestFullFetchQueueIsNoOutage(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "queuefull", withStandin, func(o *replica.Options) {
		o.Cache = externalcache.Options{QueueSize: 1, Workers: 1}
		// A binding turned away looks again after this.
		o.RetryAfter = 2 * time.Second
	})
	if err := e.standin.SetFaults(configcenter.Faults{Latency: configcenter.Duration{Duration: 300 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := newWatchClient(t).Watch(ctx, &configv1alpha1.ConfigBindingList{}, client.InNamespace(e.ns))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var said []string
	go func() {
		for ev := range w.ResultChan() {
			cb, ok := ev.Object.(*configv1alpha1.ConfigBinding)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); c != nil && c.Reason == configbinding.ReasonExternalUnavailable {
				mu.Lock()
				said = append(said, fmt.Sprintf("%s: %s", cb.Name, c.Message))
				mu.Unlock()
			}
		}
	}()
	const bindings = 16 // the config center's 4 domains × 4 keys, one each
	for i := range bindings {
		e.create(t, fmt.Sprintf("app-%d", i), fmt.Sprintf("domain-%d", i/4), fmt.Sprintf("key-%d", i%4))
	}
	controlplane.Eventually(t, 3*time.Minute, "every binding Synced", func() error {
		var list configv1alpha1.ConfigBindingList
		if err := e.c.List(ctx, &list, client.InNamespace(e.ns)); err != nil {
			return err
		}
		var not []string
		for _, cb := range list.Items {
			if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); c == nil || c.Reason != configbinding.ReasonSynced {
				not = append(not, cb.Name)
			}
		}
		if len(list.Items) != bindings || len(not) > 0 {
			return fmt.Errorf("%d bindings, not Synced: %s", len(list.Items), strings.Join(not, ", "))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if len(said) > 0 {
		t.Errorf("a full fetch queue was reported as the config center's failure %d times, e.g. %s", len(said), said[0])
	}
}
