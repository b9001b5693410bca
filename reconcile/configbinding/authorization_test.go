package configbinding_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/internal/spicedbserver"
	"github.com/kshard/kshard/reconcile/configbinding"
)

// withSpiceDB starts a SpiceDB of the test's own with kshard's schema and
// returns an adjust that makes an env's replica ask it, and a writer of
// grants.
func withSpiceDB(t *testing.T) (func(*replica.Options), *spicedbserver.Grants) {
	t.Helper()
	controlplane.Require(t, cp) // the envs need it; the unit lane runs no SpiceDB either
	srv, err := spicedbserver.Start(context.Background(), spicedbserver.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	opts := srv.ClientOptions()
	g, err := spicedbserver.Dial(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if err := g.WriteSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return func(o *replica.Options) {
		o.Authorization = replica.AuthorizationSpiceDB
		o.SpiceDB = opts
	}, g
}

// TestAuthorizedBySpiceDB: a binding whose namespace reads its domain
// through a team is Synced; one of a domain it has no grant for says
// Forbidden, naming the grant, and gets no values. Removing the namespace
// from the team (no relationship of the domain changes) takes the values
// out of the first one's ConfigMap and says Forbidden, with an Event; a
// direct grant given later makes it Ready again, without a restart. The
// replica asks SpiceDB in bulk, off the reconcile path.
func TestAuthorizedBySpiceDB(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace, config center prefix and SpiceDB
	spicedb, sc := withSpiceDB(t)
	e := startEnvWith(t, "authz", spicedb)
	member := "team:checkout#member@kubernetes/namespace:" + e.ns
	touch(t, sc, member, "configdomain:domain-1#reader@team:checkout#member")

	e.create(t, "app", "domain-1", "key-0")
	e.create(t, "other", "domain-2", "key-0")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	if got := e.configMap(t, "app-config").Data["key-0"]; got != configcenter.SeedValue("domain-1", "key-0", 16) {
		t.Fatalf("the granted binding's ConfigMap holds %q", got)
	}
	other := e.waitReason(t, "other", configbinding.ReasonForbidden)
	msg := meta.FindStatusCondition(other.Status.Conditions, configbinding.ConditionReady).Message
	if want := "configdomain:domain-2#reader@kubernetes/namespace:" + e.ns; !strings.Contains(msg, want) {
		t.Errorf("the denied binding says %q, want it to name %s", msg, want)
	}
	var cm corev1.ConfigMap
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "other-config"}, &cm); !apierrors.IsNotFound(err) {
		t.Errorf("the denied binding's ConfigMap: %v, want none", err)
	}

	remove(t, sc, member)
	e.waitReason(t, "app", configbinding.ReasonForbidden)
	if data := e.configMap(t, "app-config").Data; len(data) != 0 {
		t.Errorf("after the revocation the ConfigMap still holds %v", data)
	}
	controlplane.Eventually(t, time.Minute, "a Forbidden Event", func() error {
		var events eventsv1.EventList
		if err := e.c.List(context.Background(), &events, client.InNamespace(e.ns)); err != nil {
			return err
		}
		for _, ev := range events.Items {
			if ev.Regarding.Name == "app" && ev.Reason == configbinding.ReasonForbidden {
				return nil
			}
		}
		return fmt.Errorf("%d Events, none for app with reason %s", len(events.Items), configbinding.ReasonForbidden)
	})

	touch(t, sc, "configdomain:domain-1#reader@kubernetes/namespace:"+e.ns)
	e.waitReason(t, "app", configbinding.ReasonSynced)
	if got := e.configMap(t, "app-config").Data["key-0"]; got != configcenter.SeedValue("domain-1", "key-0", 16) {
		t.Fatalf("after the grant the ConfigMap holds %q", got)
	}
}

// touch writes relationships; remove deletes them.
func touch(t *testing.T, g *spicedbserver.Grants, rels ...string) {
	t.Helper()
	if err := g.Touch(context.Background(), rels...); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, g *spicedbserver.Grants, rels ...string) {
	t.Helper()
	if err := g.Delete(context.Background(), rels...); err != nil {
		t.Fatal(err)
	}
}
