package configbinding_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/reconcile/externaldomain"
)

// TestBrokenChangeFeedFallsBackToTTL: a proxy that answers long polls at
// once with nothing changed, or a load balancer over two config centers
// whose histories alternate, keeps every change from the change feed. The
// ConfigMap must still get a change within the values' soft TTL (a second
// here), not at the next informer resync (10 h), and the binding must not
// claim Synced meanwhile: it says ChangeFeedUnhealthy, with an Event, and
// Synced again once the feed heals.
//
// The mirror (--external-source=mirror) follows the same rule: its
// ExternalDomain says FeedUnhealthy and its keys are fetched again every
// soft TTL.
func TestBrokenChangeFeedFallsBackToTTL(t *testing.T) {
	for _, tc := range []struct {
		name, source string
		fault        configcenter.Faults
	}{
		{"short-polls", replica.SourceCache, configcenter.Faults{ShortPolls: true}},
		{"alternate-epochs", replica.SourceCache, configcenter.Faults{AlternateEpochs: true}},
		{"short-polls", replica.SourceMirror, configcenter.Faults{ShortPolls: true}},
		{"alternate-epochs", replica.SourceMirror, configcenter.Faults{AlternateEpochs: true}},
	} {
		t.Run(tc.source+"/"+tc.name, func(t *testing.T) {
			t.Parallel() // own namespaces, ring, Lease namespace and config center
			e := startEnvWith(t, "feed-"+tc.source+"-"+tc.name, withStandin, func(o *replica.Options) {
				o.ExternalSource = tc.source
				o.Cache.SoftTTL, o.Cache.HardTTL = time.Second, time.Hour
				o.Cache.FeedHealth.EpochStableFor = 2 * time.Second
			})
			domain := "feed-" + tc.source + "-" + tc.name
			e.deleteMirrors(t, domain)
			if _, err := e.cc.Put(domain, "key-0", "before"); err != nil {
				t.Fatal(err)
			}
			e.create(t, "app", domain, "key-0")
			e.waitReason(t, "app", configbinding.ReasonSynced)
			e.waitData(t, "app-config", map[string]string{"key-0": "before"})

			// Break the feed, and change the key only once the config center
			// answered polls under the fault: a poll held open from before would
			// bring the change. Changes of another key end such polls.
			faulted := time.Now()
			if err := e.standin.SetFaults(tc.fault); err != nil {
				t.Fatal(err)
			}
			controlplane.Eventually(t, 2*time.Minute, "two polls under the fault", func() error {
				polls := e.standin.Requests(func(r configcenter.RequestRecord) bool {
					return r.Route == configcenter.RouteChanges && r.Domain == domain && r.Arrived.After(faulted)
				})
				if len(polls) < 2 {
					if _, err := e.cc.Put(domain, "nudge", time.Now().String()); err != nil {
						return err
					}
					return fmt.Errorf("%d polls", len(polls))
				}
				return nil
			})
			if _, err := e.cc.Put(domain, "key-0", "after"); err != nil {
				t.Fatal(err)
			}
			e.waitData(t, "app-config", map[string]string{"key-0": "after"})

			cb := e.waitReason(t, "app", configbinding.ReasonChangeFeedUnhealthy)
			if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); c.Status != "False" || !strings.Contains(c.Message, "change feed unhealthy") {
				t.Errorf("Ready while the feed is unhealthy: %+v", c)
			}
			controlplane.Eventually(t, time.Minute, "a ChangeFeedUnhealthy Event", func() error {
				var events eventsv1.EventList
				if err := e.c.List(context.Background(), &events, client.InNamespace(e.ns)); err != nil {
					return err
				}
				for _, ev := range events.Items {
					if ev.Regarding.Name == "app" && ev.Reason == configbinding.ReasonChangeFeedUnhealthy && ev.Type == "Warning" {
						return nil
					}
				}
				return fmt.Errorf("%d Events, none for app with reason %s", len(events.Items), configbinding.ReasonChangeFeedUnhealthy)
			})

			if tc.source == replica.SourceMirror {
				e.mirrorOf(t, domain, syncedReason(externaldomain.ReasonFeedUnhealthy))
			}

			if err := e.standin.SetFaults(configcenter.Faults{}); err != nil {
				t.Fatal(err)
			}
			e.waitReason(t, "app", configbinding.ReasonSynced)
			if tc.source == replica.SourceMirror {
				e.mirrorOf(t, domain, mirrored("key-0", "after"))
			}
		})
	}
}
