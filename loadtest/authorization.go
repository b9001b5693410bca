package loadtest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/internal/spicedbserver"
)

// GrantNamespace holds the bindings whose grants the load tester revokes
// and gives back during an authorized fleet's load: a namespace of their
// own, so that a revoked binding is never one of the load's objects.
const GrantNamespace = "loadtest-grants"

// The grant probes: grantProbes bindings, one per domain, each readable by
// GrantNamespace through a direct grant of its domain; grantPause between
// two changes, so that each is a change of its own.
const (
	grantProbes  = 8
	grantPause   = 500 * time.Millisecond
	grantTimeout = time.Minute
)

// authorization is the run's SpiceDB, started when a fleet of the run is
// authorized (--authorization=spicedb): kshard's schema, namespace
// Namespace a member of team loadtest, the team a reader of every seeded
// domain, and the grant probes' direct grants.
type authorization struct {
	server *spicedbserver.Server
	grants *spicedbserver.Grants
}

// probeGrant is grant probe i's direct grant.
func probeGrant(i int) string {
	return "configdomain:" + configcenter.SeedDomain(i) + "#reader@kubernetes/namespace:" + GrantNamespace
}

// grantProbe is grant probe i's binding: key-0 of domain-i.
func grantProbe(i int) *configv1alpha1.ConfigBinding {
	name := fmt.Sprintf("grant-%d", i)
	return &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: GrantNamespace, Name: name},
		Spec: configv1alpha1.ConfigBindingSpec{
			Domain: configcenter.SeedDomain(i),
			Keys:   []configv1alpha1.ConfigKey{configv1alpha1.ConfigKey(configcenter.SeedKey(0))},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: name},
		},
	}
}

// argsFor are the flags pointing a replica of mode at the run's SpiceDB:
// none for a mode that does not ask it, or a run with no SpiceDB.
func (a *authorization) argsFor(mode Mode) []string {
	if a == nil || !mode.authorized() {
		return nil
	}
	o := a.server.ClientOptions()
	return []string{"--spicedb-endpoint", o.Endpoint, "--spicedb-token-file", o.TokenFile}
}

// close releases the client and stops SpiceDB.
func (a *authorization) close() {
	if a.grants != nil {
		_ = a.grants.Close()
	}
	_ = a.server.Close()
}

// probe revokes and gives back the grant probes' grants, one change
// at a time, until ctx ends, and times each from its write to the watch
// showing the probe's ConfigMap without its value (revoke) or with it
// (grant): loadtest_authorization_seconds.
func (a *authorization) probe(ctx context.Context, restConfig *rest.Config, obs *observations, log logr.Logger) {
	wc, err := client.NewWithWatch(restConfig, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		log.Error(err, "Creating the grant probes' watch client")
		return
	}
	maps := &grantMaps{has: map[string]bool{}, changed: make(chan struct{})}
	// The watch outlives ctx: the last change is awaited after the load
	// ends, and a watch stopped with the load would never show it.
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	ready := make(chan struct{})
	go followConfigMaps(wctx, wc, GrantNamespace, ready, maps.observe)
	<-ready
	for i := 0; ctx.Err() == nil; i++ {
		p := i % grantProbes
		name := grantProbe(p).Name
		for _, give := range []bool{false, true} {
			change := map[bool]string{false: "revoke", true: "grant"}[give]
			at := time.Now()
			var err error
			if give {
				err = a.grants.Touch(ctx, probeGrant(p))
			} else {
				err = a.grants.Delete(ctx, probeGrant(p))
			}
			if err != nil {
				if ctx.Err() == nil {
					log.Error(err, "Changing a grant", "grant", probeGrant(p))
				}
				return
			}
			if d, ok := maps.await(context.WithoutCancel(ctx), name, give, at); ok {
				obs.authorized(change, d)
			} else {
				obs.authorizationLost(change)
			}
			if sleep(ctx, grantPause) != nil {
				break
			}
		}
	}
	// The probes end granted, as the next fleet finds them.
	for p := range grantProbes {
		_ = a.grants.Touch(context.WithoutCancel(ctx), probeGrant(p))
	}
}

// grantMaps is what the watch of GrantNamespace's ConfigMaps last showed:
// whether each holds its value.
type grantMaps struct {
	mu      sync.Mutex
	has     map[string]bool
	changed chan struct{} // closed at every change, then replaced
}

// observe records whether cm holds its value.
func (g *grantMaps) observe(cm *corev1.ConfigMap, _ time.Time) {
	_, has := cm.Data[configcenter.SeedKey(0)]
	g.mu.Lock()
	defer g.mu.Unlock()
	g.has[cm.Name] = has
	close(g.changed)
	g.changed = make(chan struct{})
}

// await waits until ConfigMap name holds its value (want) or not, and says
// how long after at; false after grantTimeout.
func (g *grantMaps) await(ctx context.Context, name string, want bool, at time.Time) (time.Duration, bool) {
	deadline := time.NewTimer(time.Until(at.Add(grantTimeout)))
	defer deadline.Stop()
	for {
		g.mu.Lock()
		has, changed := g.has[name], g.changed
		g.mu.Unlock()
		if has == want {
			return time.Since(at), true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return 0, false
		case <-ctx.Done():
			return 0, false
		}
	}
}
