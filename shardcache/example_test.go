package shardcache_test

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/shardcache"
	"github.com/kshard/kshard/sharding"
)

var cp *controlplane.ControlPlane

// TestMain runs the example against a real kube-apiserver and etcd, its
// logs discarded: the example's output is what it prints.
func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	flag.Parse()
	if testing.Short() {
		// make test-unit starts no control plane, and an example cannot
		// skip: run none.
		_ = flag.Set("test.run", "^$")
	}
	os.Exit(controlplane.RunTestsWith(m, &cp, controlplane.Options{}))
}

// The example's objects: ConfigMaps that name a price list (domain and key
// in an external pricing service) and get its current value copied in.
const (
	domainAnnotation = "example.dev/price-domain"
	keyAnnotation    = "example.dev/price-list"
)

// prices is the external service: slow and remote in life, a map here,
// with a change feed (a long poll per domain) that tells the cache which
// keys changed.
type prices struct {
	mu       sync.Mutex
	revision int64
	values   map[externalcache.Key]externalcache.Value
}

func (p *prices) Fetch(_ context.Context, key externalcache.Key) (externalcache.Value, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.values[key]
	if !ok {
		return externalcache.Value{}, externalcache.ErrNotFound
	}
	return v, nil
}

func (p *prices) Changes(ctx context.Context, domain string, since int64) (externalcache.ChangeSet, error) {
	for deadline := time.Now().Add(time.Second); ; {
		p.mu.Lock()
		cs := externalcache.ChangeSet{Revision: p.revision}
		for k, v := range p.values {
			if k.Domain == domain && v.Revision > since {
				cs.Changes = append(cs.Changes, externalcache.Change{Name: k.Name, Revision: v.Revision})
			}
		}
		p.mu.Unlock()
		if len(cs.Changes) > 0 || time.Now().After(deadline) {
			return cs, nil
		}
		select {
		case <-ctx.Done():
			return cs, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (p *prices) set(key externalcache.Key, data string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.revision++
	p.values[key] = externalcache.Value{Data: []byte(data), Revision: p.revision}
}

func keyOf(o client.Object) externalcache.Key {
	return externalcache.Key{Domain: o.GetAnnotations()[domainAnnotation], Name: o.GetAnnotations()[keyAnnotation]}
}

// pricer copies a ConfigMap's price list into it: read through the shard,
// the value from the cache (never waiting on the service), the write asked
// of the shard.
type pricer struct {
	shards sharding.Shards
	cache  *shardcache.Cache
	c      client.Client
}

func (p *pricer) Reconcile(ctx context.Context, req sharding.Request) (reconcile.Result, error) {
	reader, ok := p.shards.Reader(req.Shard)
	if !ok {
		return reconcile.Result{}, nil
	}
	var cm corev1.ConfigMap
	if err := reader.Get(ctx, req.NamespacedName, &cm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	l := p.cache.Get(req.Shard, keyOf(&cm))
	if l.State != externalcache.StateFresh && l.State != externalcache.StateStale {
		return reconcile.Result{}, nil // its arrival requeues the object
	}
	if cm.Data["prices"] == string(l.Value) {
		return reconcile.Result{}, nil
	}
	wctx, done, ok := p.shards.WriteContext(ctx, req.Shard)
	defer done()
	if !ok {
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(cm.DeepCopy())
	cm.Data = map[string]string{"prices": string(l.Value)}
	return reconcile.Result{}, p.c.Patch(wctx, &cm, patch)
}

// Example shards a controller of a built-in kind (ConfigMaps naming a price
// list) across a ring — one replica here, holding all four shards — and
// keeps the pricing service off its reconcile path: each held shard's
// values in an off-heap store warmed when the shard is acquired, a changed
// price requeueing only the ConfigMaps that read it.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := client.New(cp.Config, client.Options{})
	must(err)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "shop-"}}
	must(c.Create(ctx, ns))

	service := &prices{values: map[externalcache.Key]externalcache.Value{}}
	eu, us := externalcache.Key{Domain: "eu", Name: "retail"}, externalcache.Key{Domain: "us", Name: "retail"}
	service.set(eu, "EUR 10")
	service.set(us, "USD 11")

	mgr, err := ctrl.NewManager(cp.Config, manager.Options{
		Scheme:                 clientgoscheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	must(err)
	// 1. The cache: which keys a shard's objects read (to warm it), which
	// objects read a key (to requeue them).
	cache, err := shardcache.New(shardcache.Options{
		Cache: externalcache.Options{Source: service, Feed: service},
		Keys: func(ctx context.Context, shard client.Reader) ([]externalcache.Key, error) {
			var list corev1.ConfigMapList
			err := shard.List(ctx, &list)
			var keys []externalcache.Key
			for i := range list.Items {
				keys = append(keys, keyOf(&list.Items[i]))
			}
			return keys, err
		},
		Readers: func(ctx context.Context, shard client.Reader, key externalcache.Key) ([]types.NamespacedName, error) {
			var list corev1.ConfigMapList
			err := shard.List(ctx, &list)
			var out []types.NamespacedName
			for i := range list.Items {
				if keyOf(&list.Items[i]) == key {
					out = append(out, client.ObjectKeyFromObject(&list.Items[i]))
				}
			}
			return out, err
		},
	})
	must(err)
	// 2. The ring, its shards' tenures driving the cache.
	rep, err := sharding.New(mgr, sharding.Options{
		Ring: "pricing", Identity: "pricing-0", LeaseNamespace: ns.Name, Shards: 4,
		Namespaces: []string{ns.Name},
		For:        sharding.Kind{Object: &corev1.ConfigMap{}},
		Domain:     func(o client.Object) string { return o.GetAnnotations()[domainAnnotation] },
		OnAcquire:  cache.OnAcquire,
		OnRelease:  cache.OnRelease,
	})
	must(err)
	// 3. Bind the cache to the shards, and the controller.
	must(cache.Bind(mgr, rep))
	_, err = rep.NewController("pricer", &pricer{shards: rep, cache: cache, c: mgr.GetClient()}, controller.TypedOptions[sharding.Request]{})
	must(err)
	go func() { must(mgr.Start(ctx)) }()

	for i, key := range []externalcache.Key{eu, us, eu} {
		must(c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Namespace: ns.Name, Name: fmt.Sprintf("store-%d", i),
			Annotations: map[string]string{domainAnnotation: key.Domain, keyAnnotation: key.Name},
		}}))
	}
	show := func(want map[string]string) {
		var list corev1.ConfigMapList
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			if err := c.List(ctx, &list, client.InNamespace(ns.Name)); err != nil {
				return false, nil
			}
			for _, cm := range list.Items {
				if w, ok := want[cm.Name]; ok && cm.Data["prices"] != w {
					return false, nil
				}
			}
			return true, nil
		})
		must(err)
		sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
		for _, cm := range list.Items {
			if _, ok := want[cm.Name]; ok {
				fmt.Printf("%s (%s, shard %s): %s\n", cm.Name, cm.Annotations[domainAnnotation], cm.Labels[sharding.LabelShard], cm.Data["prices"])
			}
		}
	}
	show(map[string]string{"store-0": "EUR 10", "store-1": "USD 11", "store-2": "EUR 10"})

	// The service changes a price: the stores that read it follow, the
	// others are not reconciled for it.
	service.set(eu, "EUR 12")
	fmt.Println("eu/retail changed")
	show(map[string]string{"store-0": "EUR 12", "store-2": "EUR 12"})
	fmt.Println("held:", rep.HeldShards())

	// Output:
	// store-0 (eu, shard 3): EUR 10
	// store-1 (us, shard 2): USD 11
	// store-2 (eu, shard 3): EUR 10
	// eu/retail changed
	// store-0 (eu, shard 3): EUR 12
	// store-2 (eu, shard 3): EUR 12
	// held: [0 1 2 3]
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
