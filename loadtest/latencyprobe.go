package loadtest

import (
	"context"
	"fmt"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// probeServiceAccount is the identity of the load tester's latency probe:
// a ServiceAccount like any other controller's, so that API Priority and
// Fairness puts its requests where it puts theirs (service-accounts →
// workload-low), not in the exempt level of the load tester's admin.
const probeServiceAccount = "loadtest-probe"

// probeInterval is how often the probe sends a request.
const probeInterval = 100 * time.Millisecond

// latencyProbe is another client of the API server, there to be starved:
// it lists the ConfigMaps of the Lease namespace (a few objects) every
// probeInterval and records how long each took. Its latency during a
// fleet's relists is what the fleet's syncs cost everybody else.
type latencyProbe struct {
	c client.Client

	mu      sync.Mutex
	samples []probeSample
}

// probeSample is one probe request: when it was sent, how long it took,
// and whether it failed.
type probeSample struct {
	At     time.Time
	Took   time.Duration
	Failed bool
}

// startProbe creates the probe's ServiceAccount, allowed to list
// ConfigMaps in the Lease namespace, and runs it until ctx ends.
func startProbe(ctx context.Context, c client.Client, restConfig *rest.Config) (*latencyProbe, error) {
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: probeServiceAccount}},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: probeServiceAccount},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: probeServiceAccount},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: probeServiceAccount},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: LeaseNamespace, Name: probeServiceAccount}},
		},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the probe's %T: %w", o, err)
		}
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64((48 * time.Hour).Seconds()))}}
	if err := c.SubResource("token").Create(ctx, objs[0], tr); err != nil {
		return nil, fmt.Errorf("requesting the probe's token: %w", err)
	}
	cfg := rest.AnonymousClientConfig(restConfig)
	cfg.BearerToken = tr.Status.Token
	// Its own rate, not client-go's default limiter's.
	cfg.QPS, cfg.Burst = -1, 0
	pc, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, fmt.Errorf("the probe's client: %w", err)
	}
	p := &latencyProbe{c: pc}
	go p.run(ctx)
	return p, nil
}

func (p *latencyProbe) run(ctx context.Context) {
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for {
		at := time.Now()
		reqCtx, cancel := context.WithTimeout(ctx, time.Minute)
		err := p.c.List(reqCtx, &corev1.ConfigMapList{}, client.InNamespace(LeaseNamespace))
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		p.samples = append(p.samples, probeSample{At: at, Took: time.Since(at), Failed: err != nil})
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// between summarizes the requests sent from from to to that succeeded, and
// counts those that failed.
func (p *latencyProbe) between(from, to time.Time) (LatencySummary, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var h durations
	failed := 0
	for _, s := range p.samples {
		if s.At.Before(from) || s.At.After(to) {
			continue
		}
		if s.Failed {
			failed++
			continue
		}
		h = append(h, s.Took)
	}
	return h.summary(), failed
}
