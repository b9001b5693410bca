package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/configcenter"
)

// propagationTimeout is how long a probe waits for its ConfigMaps; a
// ConfigMap that never shows the value within it counts as not reached.
const propagationTimeout = time.Minute

// probeWriters is how many value changes may be on their way to the config
// center at once.
const probeWriters = 32

// propagation measures how fast a change in the config center reaches the
// ConfigMaps: during a fleet's load it writes a fresh value to one key at a
// time and times, per ConfigMap of a binding that bound the key at the
// write, the arrival of that value (seen through a watch of the load
// tester's ConfigMaps). A binding whose spec update dropped the key
// meanwhile is not waited for.
type propagation struct {
	c   client.WithWatch
	cc  center
	set *objectSet
	gen *generator
	obs *observations

	seq int // values written, over the run: each probe's value is unique

	mu     sync.Mutex
	probes []*probe
}

type probe struct {
	domain, key, value string
	at                 time.Time
	waiting            map[string]int // ConfigMap name → object index
}

func newPropagation(c client.WithWatch, cc center, set *objectSet, gen *generator, obs *observations) *propagation {
	return &propagation{c: c, cc: cc, set: set, gen: gen, obs: obs}
}

// run probes every interval until ctx ends, then waits for the open probes
// (at most propagationTimeout). What it measures it publishes
// (loadtest_propagation_seconds, loadtest_propagation_expected_total).
func (p *propagation) run(ctx context.Context, interval time.Duration) {
	wctx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatch()
	watching := make(chan struct{})
	go followConfigMaps(wctx, p.c, Namespace, watching, p.observe)
	<-watching
	t := time.NewTicker(interval)
	defer t.Stop()
	// Writers put the values concurrently, so that a rate above what one
	// sequence of puts reaches (1,000 changes/s) is offered; a tick with
	// every writer busy is counted as skipped, not queued.
	writers := make(chan struct{}, probeWriters)
	var wg sync.WaitGroup
	// Probes end as their ConfigMaps show the value (observe), and are
	// pruned every second of the keys their bindings dropped and of the
	// timed out (open): a key is free again for the next change as soon
	// as its probe ended.
	prune := time.NewTicker(time.Second)
	defer prune.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-prune.C:
			p.open()
		case <-t.C:
			p.seq++
			select {
			case writers <- struct{}{}:
				seq := p.seq
				wg.Go(func() {
					defer func() { <-writers }()
					p.obs.valueChanged(p.start(ctx, seq))
				})
			default:
				p.obs.valueChanged(false)
			}
		}
	}
	wg.Wait()
	deadline := time.Now().Add(propagationTimeout)
	for time.Now().Before(deadline) && p.open() > 0 {
		time.Sleep(100 * time.Millisecond)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range p.probes {
		p.obs.propagationExpected(len(pr.waiting)) // never reached
	}
	p.probes = nil
}

// start writes a new value to a key that live bindings read and opens a
// probe for their ConfigMaps.
func (p *propagation) start(ctx context.Context, seq int) bool {
	g := p.gen
	g.mu.Lock()
	live := slices.Clone(g.live)
	g.mu.Unlock()
	if len(live) == 0 {
		return false
	}
	i := live[rand.IntN(len(live))]
	keys := p.set.keys(i, p.set.updates[i].Load())
	pr := &probe{
		domain:  configcenter.SeedDomain(p.set.domains[i]),
		key:     string(keys[rand.IntN(len(keys))]),
		value:   fmt.Sprintf("probe-%d", seq),
		waiting: map[string]int{},
	}
	for _, j := range live {
		if p.set.domains[j] == p.set.domains[i] && slices.Contains(p.set.keys(j, p.set.updates[j].Load()), configv1alpha1.ConfigKey(pr.key)) {
			pr.waiting[p.set.names[j]+"-config"] = j
		}
	}
	p.mu.Lock()
	if slices.ContainsFunc(p.probes, func(x *probe) bool { return x.domain == pr.domain && x.key == pr.key }) {
		// A newer value would hide this one from the open probe's ConfigMaps.
		p.mu.Unlock()
		return false
	}
	p.probes = append(p.probes, pr)
	pr.at = time.Now()
	p.mu.Unlock()
	if err := p.cc.put(ctx, pr.domain, pr.key, pr.value); err != nil {
		p.mu.Lock()
		p.probes = slices.DeleteFunc(p.probes, func(x *probe) bool { return x == pr })
		p.mu.Unlock()
		return false
	}
	return true
}

// open counts ConfigMaps still waited for, dropping the ones whose binding
// no longer reads the probed key, and closing probes older than the timeout.
func (p *propagation) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	kept := p.probes[:0]
	for _, pr := range p.probes {
		for cm, j := range pr.waiting {
			if !slices.Contains(p.set.keys(j, p.set.updates[j].Load()), configv1alpha1.ConfigKey(pr.key)) {
				delete(pr.waiting, cm)
			}
		}
		switch {
		case len(pr.waiting) == 0:
		case time.Since(pr.at) > propagationTimeout:
			p.obs.propagationExpected(len(pr.waiting)) // never reached
		default:
			kept = append(kept, pr)
			n += len(pr.waiting)
		}
	}
	p.probes = kept
	return n
}

// followConfigMaps calls seen with every ConfigMap of namespace added or
// changed, and when, until ctx ends, watching again when the API server
// closes the watch; ready is closed once the first watch is open.
func followConfigMaps(ctx context.Context, c client.WithWatch, namespace string, ready chan<- struct{}, seen func(*corev1.ConfigMap, time.Time)) {
	once := sync.Once{}
	defer once.Do(func() { close(ready) })
	for ctx.Err() == nil {
		w, err := c.Watch(ctx, &corev1.ConfigMapList{}, client.InNamespace(namespace))
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		once.Do(func() { close(ready) })
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok {
				seen(cm, time.Now())
			}
		}
		w.Stop()
	}
}

// observe ends the waits cm's data answers, and the probes with nothing
// left to wait for.
func (p *propagation) observe(cm *corev1.ConfigMap, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probes = slices.DeleteFunc(p.probes, func(pr *probe) bool {
		if _, ok := pr.waiting[cm.Name]; ok && cm.Data[pr.key] == pr.value {
			delete(pr.waiting, cm.Name)
			p.obs.propagated(now.Sub(pr.at))
			p.obs.propagationExpected(1)
			return len(pr.waiting) == 0
		}
		return false
	})
}
