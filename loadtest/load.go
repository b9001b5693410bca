package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
)

// Namespace holds the load tester's ConfigBindings and their ConfigMaps.
const Namespace = "loadtest"

// loadWorkers is the number of concurrent writers. The load is open-loop
// (a rate, not a number of clients), so there must be enough writers to
// keep the rate while the API server is slow: 64 keep 50 writes/s at
// 1.28 s per write.
const loadWorkers = 64

// objectSet is the run's ConfigBindings: their names, domains and keys. It
// is a pure function of the options (and the seed), so two runs with the
// same flags create the same objects.
type objectSet struct {
	o       Options
	names   []string
	domains []int
	// updates counts the spec updates issued per object; the next update's
	// keys are a function of it.
	updates []atomic.Int64
	// pool selects the half of each domain's keys updates pick from: 0 the
	// lower half (or every key), 1 the upper half, which nothing read
	// before (the external-outage scenario's uncached keys).
	pool atomic.Int32
	// split says whether the key space is split in two pools.
	split bool
}

func newObjectSet(o Options, split bool) *objectSet {
	rng := rand.New(rand.NewPCG(o.Seed, 0x6b7368617264)) // "kshard"
	var pick func() int
	switch o.Skew {
	case SkewZipf:
		z := rand.NewZipf(rng, o.ZipfS, 1, uint64(o.Domains-1))
		pick = func() int { return int(z.Uint64()) }
	default:
		pick = func() int { return rng.IntN(o.Domains) }
	}
	s := &objectSet{o: o, names: make([]string, o.Objects), domains: make([]int, o.Objects), updates: make([]atomic.Int64, o.Objects), split: split}
	width := len(fmt.Sprint(o.Objects - 1))
	for i := range o.Objects {
		s.names[i] = fmt.Sprintf("cb-%0*d", width, i)
		s.domains[i] = pick()
	}
	return s
}

// keys returns the keys of object i at its j-th version: KeysPerObject
// consecutive keys of its domain's current pool, starting at an offset that
// moves by one per version, so every update changes the spec and objects of
// one domain share keys (the cache serves the second reader from memory).
func (s *objectSet) keys(i int, j int64) []configv1alpha1.ConfigKey {
	lo, n := 0, s.o.KeysPerDomain
	if s.split {
		n = s.o.KeysPerDomain / 2
		if s.pool.Load() == 1 {
			lo = n
		}
	}
	start := (i/s.o.Domains + int(j%int64(n))) % n
	out := make([]configv1alpha1.ConfigKey, 0, s.o.KeysPerObject)
	for m := range min(s.o.KeysPerObject, n) {
		out = append(out, configv1alpha1.ConfigKey(configcenter.SeedKey(lo+(start+m)%n)))
	}
	return out
}

// object is the i-th ConfigBinding as first created. It carries no shard
// label: stamping it is the labeler's job (or the API server's at CREATE,
// for a domain in the shard table).
func (s *objectSet) object(i int) *configv1alpha1.ConfigBinding {
	return &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: s.names[i]},
		Spec: configv1alpha1.ConfigBindingSpec{
			Domain: configcenter.SeedDomain(s.domains[i]),
			Keys:   s.keys(i, 0),
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: s.names[i] + "-config"},
		},
	}
}

// loadStats counts what the generator did.
type loadStats struct {
	creates, updates, deletes, errors atomic.Int64
	lastErr                           atomic.Value // string
}

func (l *loadStats) fail(err error) {
	l.errors.Add(1)
	l.lastErr.Store(err.Error())
}

// generator writes the load: creates, spec updates and deletes, and tells
// the tracker the generation each write produced, when.
type generator struct {
	c       client.Client
	set     *objectSet
	tracker *tracker
	stats   loadStats
	// created marks the objects that exist (created and not deleted).
	mu      sync.Mutex
	created []bool
	live    []int
	// held are objects the spec updates leave alone meanwhile: a probe's,
	// whose keys must stay what the probe changed.
	held map[int]bool
	// phases counts the update phases: the n-th draws its objects from
	// (Seed, n), so a run with the same seed updates the same objects in
	// the same order.
	phases uint64
}

func newGenerator(c client.Client, set *objectSet, t *tracker) *generator {
	return &generator{c: c, set: set, tracker: t, created: make([]bool, len(set.names))}
}

// createRange creates objects [from, to) at rate per second, keeping ones
// that exist. It returns when all were created or ctx ended. With track,
// the tracker measures each creation's latency to Ready.
func (g *generator) createRange(ctx context.Context, from, to int, perSecond float64, track bool) error {
	lim := rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond/10)))
	return g.parallel(ctx, to-from, lim, func(ctx context.Context, k int) error {
		i := from + k
		cb := g.set.object(i)
		start := time.Now()
		err := g.c.Create(ctx, cb)
		switch {
		case apierrors.IsAlreadyExists(err):
			g.markCreated(i)
			return nil
		case err != nil:
			return fmt.Errorf("creating ConfigBinding %s: %w", cb.Name, err)
		}
		g.stats.creates.Add(1)
		g.markCreated(i)
		if track {
			g.tracker.wrote(Namespace+"/"+cb.Name, cb.Generation, start, writeCreate)
		}
		return nil
	})
}

func (g *generator) markCreated(i int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.created[i] {
		g.created[i] = true
		g.live = append(g.live, i)
	}
}

// hold keeps the spec updates off object i until release.
func (g *generator) hold(i int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == nil {
		g.held = map[int]bool{}
	}
	g.held[i] = true
}

// release lets the spec updates at object i again.
func (g *generator) release(i int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.held, i)
}

// existing is the number of objects that exist.
func (g *generator) existing() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.live)
}

// updateFor issues spec updates at perSecond to random existing objects for
// d, or until ctx ends. Failed writes are counted, not fatal: the API server
// of a loaded machine may time out, and the run reports it.
func (g *generator) updateFor(ctx context.Context, d time.Duration, perSecond float64) {
	if perSecond <= 0 || d <= 0 {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		return
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	lim := rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond/10)))
	g.mu.Lock()
	g.phases++
	phase := g.phases
	g.mu.Unlock()
	rng := rand.New(rand.NewPCG(g.set.o.Seed, phase))
	var rmu sync.Mutex
	next := func() (int, bool) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.live) == 0 {
			return 0, false
		}
		rmu.Lock()
		defer rmu.Unlock()
		for {
			if i := g.live[rng.IntN(len(g.live))]; !g.held[i] || len(g.held) >= len(g.live) {
				return i, !g.held[i]
			}
		}
	}
	_ = g.parallel(ctx, -1, lim, func(ctx context.Context, _ int) error {
		i, ok := next()
		if !ok {
			return nil
		}
		if err := g.update(ctx, i); err != nil {
			g.stats.fail(err)
		}
		return nil
	})
}

// update changes object i's keys with a merge patch (no resourceVersion
// precondition: the controller patches status meanwhile, and a spec change
// must not conflict with it) and records the new generation.
func (g *generator) update(ctx context.Context, i int) error {
	j := g.set.updates[i].Add(1)
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"keys": g.set.keys(i, j)}})
	if err != nil {
		return err
	}
	cb := &configv1alpha1.ConfigBinding{}
	cb.Namespace, cb.Name = Namespace, g.set.names[i]
	start := time.Now()
	if err := g.c.Patch(ctx, cb, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("updating ConfigBinding %s: %w", cb.Name, err)
	}
	g.stats.updates.Add(1)
	g.tracker.wrote(Namespace+"/"+cb.Name, cb.Generation, start, writeUpdate)
	return nil
}

// touchAll updates every existing object once, as fast as the workers go:
// the resync storm.
func (g *generator) touchAll(ctx context.Context) error {
	g.mu.Lock()
	live := append([]int(nil), g.live...)
	g.mu.Unlock()
	return g.parallel(ctx, len(live), rate.NewLimiter(rate.Inf, 0), func(ctx context.Context, k int) error {
		if err := g.update(ctx, live[k]); err != nil {
			g.stats.fail(err)
		}
		return nil
	})
}

// deleteAll deletes every ConfigBinding and ConfigMap of the namespace (the
// ConfigMaps too: no garbage collector runs on the load tester's control
// plane) and forgets the objects, so that createRange makes them anew: no
// label, status or ConfigMap, generation 1.
func (g *generator) deleteAll(ctx context.Context) error {
	in := client.InNamespace(Namespace)
	if err := g.c.DeleteAllOf(ctx, &configv1alpha1.ConfigBinding{}, in); err != nil {
		return fmt.Errorf("deleting the ConfigBindings: %w", err)
	}
	// The namespace's own root CA ConfigMap stays.
	keep := client.MatchingFieldsSelector{Selector: fields.OneTermNotEqualSelector("metadata.name", "kube-root-ca.crt")}
	if err := g.c.DeleteAllOf(ctx, &corev1.ConfigMap{}, in, keep); err != nil {
		return fmt.Errorf("deleting the ConfigMaps: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.created)
	g.live = g.live[:0]
	for i := range g.set.updates {
		g.set.updates[i].Store(0)
	}
	return nil
}

// writeTimeout bounds one write of the load generator.
const writeTimeout = 30 * time.Second

// parallel runs fn for k = 0..n-1 (n < 0: until ctx ends) on loadWorkers
// goroutines, each call admitted by lim. The first error stops it and is
// returned; ctx ending is not an error. ctx ending stops new calls but lets
// the writes in flight finish (each within writeTimeout), so the end of a
// phase does not turn into failed requests.
func (g *generator) parallel(ctx context.Context, n int, lim *rate.Limiter, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range loadWorkers {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if n >= 0 && k >= n {
					return
				}
				if err := lim.Wait(ctx); err != nil {
					return
				}
				wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
				err := fn(wctx, k)
				wcancel()
				if err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
