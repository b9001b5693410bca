package sandbox

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/shardwrites"
)

// newClient is the sandbox's own API client: it creates the sample objects
// and reads the ring and the objects' status for the script and the view.
func newClient(cfg *rest.Config) (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building the scheme: %w", err)
	}
	if err := configv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building the scheme: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	return c, nil
}

// createNamespaces creates the namespaces, keeping ones that exist (an
// existing cluster, USE_EXISTING_CLUSTER=true).
func createNamespaces(ctx context.Context, c client.Client, names ...string) error {
	for _, name := range names {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating namespace %s: %w", name, err)
		}
	}
	return nil
}

// installShardLabelPolicy installs deploy/base's kshard-shard-label
// admission policy and its binding, whose params are the labeler's shard
// table in the sandbox's Lease namespace: an object created once the
// labeler has seen its domain is labeled by the API server at its CREATE,
// as on a cluster. Ones that exist (an existing cluster) are kept.
func installShardLabelPolicy(ctx context.Context, c client.Client) error {
	ring := shardwrites.DefaultRing()
	ring.Namespace = LeaseNamespace
	policy, binding := ring.ShardLabel()
	for _, o := range []client.Object{policy, binding} {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("installing %s: %w", o.GetName(), err)
		}
	}
	return nil
}

// sampleBindings are the demo's ConfigBindings: object i belongs to domain
// i mod Domains and binds 2 or 3 consecutive keys of it, starting at a key
// that shifts with i, so bindings of one domain overlap in keys and the
// external cache serves the second reader of a key from memory.
//
// They carry no shard label: stamping it is the labeler's job (or the API
// server's at CREATE, for a domain in the shard table), and watching it
// happen is part of the demo.
func sampleBindings(o Options) []*configv1alpha1.ConfigBinding {
	width := len(fmt.Sprint(o.Objects - 1))
	out := make([]*configv1alpha1.ConfigBinding, 0, o.Objects)
	for i := range o.Objects {
		name := fmt.Sprintf("binding-%0*d", width, i)
		n := min(2+i%2, o.KeysPerDomain)
		keys := make([]configv1alpha1.ConfigKey, 0, n)
		for m := range n {
			keys = append(keys, configv1alpha1.ConfigKey(configcenter.SeedKey((i/o.Domains+m)%o.KeysPerDomain)))
		}
		out = append(out, &configv1alpha1.ConfigBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
			Spec: configv1alpha1.ConfigBindingSpec{
				Domain: configcenter.SeedDomain(i % o.Domains),
				Keys:   keys,
				Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: name + "-config"},
			},
		})
	}
	return out
}

// createBindings creates the objects a few at a time (the API server is on
// the same small machine), keeping ones that exist.
func createBindings(ctx context.Context, c client.Client, bindings []*configv1alpha1.ConfigBinding) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, cb := range bindings {
		g.Go(func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("creating ConfigBinding %s/%s panicked: %v", cb.Namespace, cb.Name, r)
				}
			}()
			if err := c.Create(ctx, cb); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating ConfigBinding %s/%s: %w", cb.Namespace, cb.Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}
