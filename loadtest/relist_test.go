package loadtest

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
)

// TestServerCountsCompletedSyncs reads the real API server's count of the
// syncs it completed, which the relist check holds to the informers'
// allowance: a cluster-wide informer's watch-list counts once when it has
// synced, a cluster-wide LIST once, and an informer of one namespace (the
// load tester's own) not at all.
func TestServerCountsCompletedSyncs(t *testing.T) {
	controlplane.Require(t, cp)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	read := func() float64 {
		t.Helper()
		s, err := scrapeServerSyncs(ctx, cs.RESTClient())
		if err != nil {
			t.Fatal(err)
		}
		if s.Started.IsZero() || s.Started.After(time.Now()) {
			t.Errorf("the API server's start %s", s.Started)
		}
		return s.ByResource[resourceBindings]
	}
	// sync starts an informer of ConfigBindings (in ns, or cluster-wide)
	// and waits until it synced.
	sync := func(ns string) {
		t.Helper()
		opts := cache.Options{Scheme: replica.Scheme()}
		if ns != "" {
			opts.DefaultNamespaces = map[string]cache.Config{ns: {}}
		}
		c, err := cache.New(rest.CopyConfig(cp.Config), opts)
		if err != nil {
			t.Fatal(err)
		}
		inf, err := c.GetInformer(ctx, &configv1alpha1.ConfigBinding{})
		if err != nil {
			t.Fatal(err)
		}
		ictx, stop := context.WithCancel(ctx)
		t.Cleanup(stop)
		go func() { _ = c.Start(ictx) }()
		if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatal("the informer did not sync")
		}
	}
	// The server's counter moves when the request is done: look again
	// until it does, or a minute passed.
	await := func(want float64) {
		t.Helper()
		var got float64
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if got = read(); got == want {
				return
			}
		}
		t.Fatalf("the server counts %v completed cluster-wide syncs of configbindings, want %v", got, want)
	}

	before := read()
	sync("")
	await(before + 1)
	c, err := client.New(cp.Config, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, &configv1alpha1.ConfigBindingList{}); err != nil {
		t.Fatal(err)
	}
	await(before + 2)
	sync(Namespace)
	if err := c.List(ctx, &configv1alpha1.ConfigBindingList{}, client.InNamespace(Namespace)); err != nil {
		t.Fatal(err)
	}
	// A namespaced sync moves nothing: the next cluster-wide one is +1.
	if err := c.List(ctx, &configv1alpha1.ConfigBindingList{}); err != nil {
		t.Fatal(err)
	}
	await(before + 3)
}
