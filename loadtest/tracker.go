package loadtest

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/ring"
)

// What a write was, for the latency histograms.
type writeKind int

const (
	writeCreate writeKind = iota
	writeUpdate
)

// latencySample is one generation that became Ready: when it was written,
// and how long until the status showed it Ready.
type latencySample struct {
	Done    time.Time
	Latency time.Duration
	Kind    writeKind
	// Key and Gen name the object and the generation the write made, so
	// the sample can be split at its reconcile (the audit log).
	Key string
	Gen int64
}

// tracker watches the ConfigBindings and measures, for every generation the
// load tester wrote, the time from the write (the request being sent) to the
// watch showing status Ready at that generation: the client-side end-to-end
// latency of a spec change. A generation overtaken by a newer one before it
// was seen Ready completes when any later generation is Ready, as a reader
// of the status would see it.
type tracker struct {
	// shards is the ring's shard count, which the objects' labels name.
	shards  int32
	mu      sync.Mutex
	objects map[string]*objectState
	samples []latencySample

	// ownSyncs counts the initial syncs of ConfigBindings (LISTs and
	// watch-lists) the tracker's informer made, so the API server's counts
	// can be split into the replicas' and the load tester's.
	ownSyncs *atomic.Int64
	// obs publishes what the tracker sees as the load tester's metrics.
	obs *observations
}

// objectState is what the tracker knows of one ConfigBinding.
type objectState struct {
	shard      int32     // -1 without a valid label
	generation int64     // latest seen or written
	seenGen    int64     // generation of the last watch event
	ready      bool      // Ready=True for seenGen in the last watch event
	createdAt  time.Time // when the load tester sent its create, if it tracks it
	readyGen   int64     // latest generation seen Ready
	readyAt    time.Time
	// seenUnlabeled says the watch showed the object without a valid
	// shard label, so its first label is a labeling the run saw happen
	// (not one it found at the watch's start).
	seenUnlabeled bool
	reason        string // the Ready condition's reason
	pending       []pendingWrite
}

type pendingWrite struct {
	gen  int64
	at   time.Time
	kind writeKind
}

// newTracker starts watching the ConfigBindings of the load tester's
// namespace.
func newTracker(ctx context.Context, cfg *rest.Config, shards int32, obs *observations, ownSyncs *atomic.Int64) (*tracker, error) {
	t := &tracker{objects: map[string]*objectState{}, shards: shards, obs: obs, ownSyncs: ownSyncs}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &syncCounter{next: rt, n: t.ownSyncs} })
	c, err := cache.New(cfg, cache.Options{
		Scheme:            replica.Scheme(),
		DefaultNamespaces: map[string]cache.Config{Namespace: {}},
		DefaultTransform:  cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the ConfigBinding watch: %w", err)
	}
	inf, err := c.GetInformer(ctx, &configv1alpha1.ConfigBinding{})
	if err != nil {
		return nil, fmt.Errorf("creating the ConfigBinding watch: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.observe(obj) },
		UpdateFunc: func(_, obj any) { t.observe(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if cb, ok := obj.(*configv1alpha1.ConfigBinding); ok {
				t.forget(cb.Namespace + "/" + cb.Name)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("watching ConfigBindings: %w", err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("the ConfigBinding watch did not sync: %w", context.Cause(ctx))
	}
	return t, nil
}

// The resources the load tester counts its own requests of.
const (
	resourceBindings   = "configbindings"
	resourceConfigMaps = "configmaps"
)

// objectResources are the resources whose writes the object-write counts
// take in: the objects the controller reconciles and the ones it writes
// for them.
var objectResources = []string{resourceBindings, resourceConfigMaps}

// syncCounter counts initial syncs: GETs of a ConfigBinding collection that
// are LISTs, or watches that ask for the initial state (watch-list).
type syncCounter struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (l *syncCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/"+resourceBindings) {
		q := req.URL.Query()
		if q.Get("watch") != "true" || q.Get("sendInitialEvents") == "true" {
			l.n.Add(1)
		}
	}
	return l.next.RoundTrip(req)
}

// writeCounter counts the object writes a client sends: POST, PUT, PATCH
// and DELETE requests on ConfigBindings and ConfigMaps, any subresource.
// It counts on sending, whatever the answer, as the API server's
// apiserver_request_total counts every code; only a request that never
// reached the server is counted here alone.
type writeCounter struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (w *writeCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		if slices.Contains(objectResources, resourceOfPath(req.URL.Path)) {
			w.n.Add(1)
		}
	}
	return w.next.RoundTrip(req)
}

// resourceOfPath is the resource a Kubernetes API path names, after any
// prefix of the server's URL: configmaps for
// /api/v1/namespaces/ns/configmaps/x, configbindings for
// /apis/config.kshard.dev/v1alpha1/namespaces/ns/configbindings/x/status,
// namespaces for /api/v1/namespaces; "" for a path outside the API.
func resourceOfPath(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		switch {
		case p == "api" && i+1 < len(parts):
			parts = parts[i+2:]
		case p == "apis" && i+2 < len(parts):
			parts = parts[i+3:]
		default:
			continue
		}
		if len(parts) >= 3 && parts[0] == "namespaces" {
			return parts[2]
		}
		if len(parts) > 0 {
			return parts[0]
		}
		return ""
	}
	return ""
}

func (t *tracker) state(key string) *objectState {
	s := t.objects[key]
	if s == nil {
		s = &objectState{shard: -1}
		t.objects[key] = s
	}
	return s
}

// observe takes a watch event.
func (t *tracker) observe(obj any) {
	cb, ok := obj.(*configv1alpha1.ConfigBinding)
	if !ok {
		return
	}
	now := time.Now()
	key := cb.Namespace + "/" + cb.Name
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.state(key)
	s.generation = max(s.generation, cb.Generation)
	was := s.shard
	s.shard = -1
	if n, ok := ring.KeysFor(sharding.DefaultLabelPrefix).ShardLabel(cb.Labels, t.shards); ok {
		s.shard = n
	}
	if was < 0 && s.shard >= 0 && (!s.createdAt.IsZero() || s.seenUnlabeled) {
		t.obs.labeledAt(now, s.createdAt)
	}
	if s.shard < 0 {
		s.seenUnlabeled = true
	}
	s.reason = ""
	cond := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
	if cond != nil {
		s.reason = cond.Reason
	}
	// Ready for the object's current generation: right after a spec
	// change the condition still says True for the previous one.
	ready := cond != nil && cond.Status == "True" && cond.ObservedGeneration == cb.Generation
	if s.ready && !ready && s.seenGen == cb.Generation {
		t.obs.flapped()
	}
	s.ready, s.seenGen = ready, cb.Generation
	if cond != nil && cond.Status == "True" && cond.ObservedGeneration == cb.Status.ObservedGeneration && cb.Status.ObservedGeneration > s.readyGen {
		s.readyGen, s.readyAt = cb.Status.ObservedGeneration, now
		t.complete(key, s)
	}
}

// wrote records a generation the load tester wrote at start.
func (t *tracker) wrote(key string, gen int64, start time.Time, kind writeKind) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.state(key)
	s.generation = max(s.generation, gen)
	if kind == writeCreate && s.shard < 0 {
		s.createdAt = start
	}
	s.pending = append(s.pending, pendingWrite{gen: gen, at: start, kind: kind})
	t.obs.wrote(kind.String())
	// The watch may have shown it Ready before the write's response arrived.
	t.complete(key, s)
}

// complete turns the pending writes that the latest Ready generation covers
// into samples.
func (t *tracker) complete(key string, s *objectState) {
	kept := s.pending[:0]
	for _, p := range s.pending {
		if p.gen <= s.readyGen {
			t.samples = append(t.samples, latencySample{Done: s.readyAt, Latency: max(s.readyAt.Sub(p.at), 0), Kind: p.kind, Key: key, Gen: p.gen})
			t.obs.readyAfter(p.kind, max(s.readyAt.Sub(p.at), 0))
		} else {
			kept = append(kept, p)
		}
	}
	s.pending = kept
}

// forget drops a deleted object.
func (t *tracker) forget(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.objects, key)
}

// samplesBetween returns the samples of a kind completed within [from, to).
func (t *tracker) samplesBetween(from, to time.Time, kind writeKind) []latencySample {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []latencySample
	for _, s := range t.samples {
		if s.Kind == kind && !s.Done.Before(from) && s.Done.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// notReady lists the objects whose latest generation is not Ready yet, with
// at most a few examples.
func (t *tracker) notReady() (count, total int, examples []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, s := range t.objects {
		total++
		if s.readyGen >= s.generation {
			continue
		}
		count++
		if len(examples) < 3 {
			examples = append(examples, fmt.Sprintf("%s at generation %d, Ready at %d (reason %q)", key, s.generation, s.readyGen, s.reason))
		}
	}
	sort.Strings(examples)
	return count, total, examples
}

// reasons counts the objects by their Ready condition's reason.
func (t *tracker) reasons() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for _, s := range t.objects {
		r := s.reason
		if r == "" {
			r = "None"
		}
		out[r]++
	}
	return out
}

// byShard returns the keys of the objects per shard label (-1: unlabeled).
func (t *tracker) byShard() map[int32][]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[int32][]string{}
	for key, s := range t.objects {
		out[s.shard] = append(out[s.shard], key)
	}
	return out
}

// count is the number of ConfigBindings seen.
func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.objects)
}

// pendingCount is the number of written generations not yet seen Ready.
func (t *tracker) pendingCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, s := range t.objects {
		n += len(s.pending)
	}
	return n
}

// durations are latencies the load tester measured itself, outside what it
// publishes: its calibration's patches, the reconcile split of the audit
// log, the API server probe.
type durations []time.Duration

// summary is the durations' count, median, p99 and maximum (the smallest
// sample at or above which that share of them lies).
func (d durations) summary() LatencySummary {
	s := slices.Clone(d)
	slices.Sort(s)
	q := func(f float64) time.Duration {
		if len(s) == 0 {
			return 0
		}
		return s[min(max(int(math.Ceil(f*float64(len(s))))-1, 0), len(s)-1)]
	}
	return LatencySummary{Count: len(s), P50: q(0.5), P99: q(0.99), Max: q(1)}
}
