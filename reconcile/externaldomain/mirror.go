package externaldomain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/sharding"
)

// Condition type and reasons of an ExternalDomain.
const (
	ConditionSynced = "Synced"
	// ReasonSynced: the mirror holds every key of the domain at its revision.
	ReasonSynced = "Synced"
	// ReasonTooLarge: the domain does not fit in one object; its keys are
	// not mirrored and its ConfigBindings say so. Raise --mirror-max-bytes
	// (up to what etcd accepts) or read this controller's data through the
	// cache (--external-source=cache).
	ReasonTooLarge = "TooLarge"
	// ReasonUnavailable: the config center fails; the mirror keeps its last
	// keys and catches up by itself.
	ReasonUnavailable = "Unavailable"
	// ReasonFeedUnhealthy: the domain's change feed cannot be trusted (its
	// polls fail, come back at once with nothing changed, or alternate
	// between histories; the message says which). The mirror holds every
	// key, fetched again every RefreshInterval instead, so a change may be
	// that late. It heals by itself when the feed does.
	ReasonFeedUnhealthy = "FeedUnhealthy"
)

// Shards is what the mirror needs from the sharding runtime.
type Shards interface {
	// Reader is the shard's cache, holding the shard's ExternalDomains.
	Reader(shard int32) (client.Reader, bool)
	// Holds reports whether the shard is held now.
	Holds(shard int32) bool
	// WriteContext grants one write of the shard's mirrors: ok is false
	// when the shard is not held now, and the context ends with the hold.
	WriteContext(ctx context.Context, shard int32) (context.Context, context.CancelFunc, bool)
	Identity() string
}

// Options configure a Mirror.
type Options struct {
	// Client writes ExternalDomains. Required.
	Client client.Client
	// APIReader re-reads a mirror after a write conflict. Required.
	APIReader client.Reader
	// Source reads the config center's values. The replica passes its
	// external cache (externalcache.Cache.Fetch), so that the mirror's
	// fetches go through the cache's Retry-After hold, rate limit, circuit
	// breaker and single flight rather than around them. Required.
	Source externalcache.Source
	// Feed is the config center's change feed. Required.
	Feed externalcache.Feed
	// Shards tells which shards this replica holds. Required.
	Shards Shards
	// Ring names the ring whose replicas write the mirrors; each mirror
	// carries it as a label. A holder collects only its own ring's mirrors:
	// the objects are cluster-scoped, and another ring of the cluster (a
	// second deployment, a test) has the same shard numbers. Required.
	Ring string
	// MaxBytes bounds a mirror's keys (names and values, plus a fixed
	// overhead per key); a larger domain gets the TooLarge condition instead
	// of a write the API server would reject. Defaults to 512 KiB, a third
	// of etcd's default request limit.
	MaxBytes int64
	// MaxRetryAfter caps a Retry-After the config center sends: a proxy's
	// maintenance page may ask for a day, and the mirror would stay stale
	// that long after the service is back. Defaults to one minute, as the
	// cache's (the replica passes --cache-max-retry-after to both).
	MaxRetryAfter time.Duration
	// FeedRetry backs off a domain's change-feed loop after failures and
	// spaces the polls that returned no change, so that a feed that answers
	// at once cannot spin; its zero fields take the defaults documented on
	// externalcache.FeedRetryOptions. The replica passes the cache's.
	FeedRetry externalcache.FeedRetryOptions
	// FeedHealth decides when a domain's change feed is unhealthy, by the
	// cache's rule; its zero fields take externalcache.FeedHealthOptions'
	// defaults. The replica passes the cache's.
	FeedHealth externalcache.FeedHealthOptions
	// RefreshInterval is how often every key of a mirror is fetched again
	// while its domain's change feed is unhealthy: a change then reaches
	// the mirror this late at most, rather than never. Defaults to 5
	// minutes, the cache's default soft TTL (the replica passes
	// --cache-soft-ttl).
	RefreshInterval time.Duration
	Log             logr.Logger
}

func (o *Options) setDefaults() error {
	var errs []error
	if o.Client == nil {
		errs = append(errs, errors.New("client is required"))
	}
	if o.APIReader == nil {
		errs = append(errs, errors.New("API reader is required"))
	}
	if o.Source == nil {
		errs = append(errs, errors.New("source is required"))
	}
	if o.Feed == nil {
		errs = append(errs, errors.New("feed is required"))
	}
	if o.Shards == nil {
		errs = append(errs, errors.New("shards are required"))
	}
	if o.Ring == "" {
		errs = append(errs, errors.New("ring is required"))
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = 512 << 10
	}
	if o.MaxRetryAfter == 0 {
		o.MaxRetryAfter = time.Minute
	}
	if o.RefreshInterval == 0 {
		o.RefreshInterval = 5 * time.Minute
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	return errors.Join(errs...)
}

// Mirror runs one sync loop per mirrored domain of the shards this replica
// holds.
type Mirror struct {
	opts Options

	mu    sync.Mutex
	ctx   context.Context // set by Start; loops ensured before it start then
	loops map[loopKey]*loop
	// releasing are the domains whose loop ReleaseDomain is stopping and whose mirror it is
	// deleting; an Ensure meanwhile marks again, and the domain is mirrored afresh after.
	releasing map[loopKey]*release
}

// release is one ReleaseDomain under way.
type release struct {
	again bool
}

type loopKey struct {
	shard  int32
	domain string
}

type loop struct {
	cancel context.CancelFunc // nil until started
	done   chan struct{}

	mu sync.Mutex
	// missing: a reader found no mirror in the shard's cache since the
	// syncer last looked (Missing).
	missing bool
	// interrupt ends the change-feed poll under way, so that a missing
	// mirror is written again now rather than after the long poll.
	interrupt context.CancelFunc
}

// pollContext is the context of one change-feed poll. Missing ends it early
// only when the poll is interruptible: when the loop holds a mirror it may
// have to write again. A loop that has written nothing yet creates the
// mirror after its poll anyway, and the bindings of a new domain, each
// finding no mirror, would otherwise cut its first poll short one after the
// other. Call the returned function when the poll returned.
func (l *loop) pollContext(ctx context.Context, interruptible bool) (context.Context, func()) {
	if !interruptible {
		return ctx, func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	l.mu.Lock()
	l.interrupt = cancel
	l.mu.Unlock()
	return pctx, func() {
		l.mu.Lock()
		l.interrupt = nil
		l.mu.Unlock()
		cancel()
	}
}

// markMissing records that a reader found no mirror, and ends the poll
// under way.
func (l *loop) markMissing() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.missing = true
	if l.interrupt != nil {
		l.interrupt()
	}
}

// takeMissing reports, and clears, a missing mark.
func (l *loop) takeMissing() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.missing
	l.missing = false
	return m
}

// New validates the options.
func New(opts Options) (*Mirror, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, fmt.Errorf("mirror options: %w", err)
	}
	return &Mirror{opts: opts, loops: map[loopKey]*loop{}, releasing: map[loopKey]*release{}}, nil
}

// Start runs until ctx is done, then stops every loop. It implements
// manager.Runnable.
func (m *Mirror) Start(ctx context.Context) error {
	m.mu.Lock()
	m.ctx = ctx
	for k, l := range m.loops {
		m.startLocked(k, l)
	}
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	loops := m.loops
	m.loops = map[loopKey]*loop{}
	m.mu.Unlock()
	stop(loops)
	mirrorDomains.Sub(float64(len(loops)))
	return nil
}

// NeedLeaderElection is false: every replica mirrors the domains of the
// shards it holds.
func (m *Mirror) NeedLeaderElection() bool { return false }

// Ensure makes sure the domain's mirror is kept current while the shard is
// held. It never blocks: reconciles call it on every read.
func (m *Mirror) Ensure(shard int32, domain string) {
	if !m.opts.Shards.Holds(shard) {
		return
	}
	k := loopKey{shard, domain}
	m.mu.Lock()
	defer m.mu.Unlock()
	if rel := m.releasing[k]; rel != nil {
		// Its mirror is being deleted: a loop started now could write it before the delete.
		rel.again = true
		return
	}
	m.ensureLocked(k)
}

// ensureLocked starts a loop for k unless one runs or the mirror stopped.
func (m *Mirror) ensureLocked(k loopKey) {
	if _, ok := m.loops[k]; ok || (m.ctx != nil && m.ctx.Err() != nil) {
		return
	}
	l := &loop{done: make(chan struct{})}
	m.loops[k] = l
	mirrorDomains.Inc()
	if m.ctx != nil {
		m.startLocked(k, l)
	}
}

func (m *Mirror) startLocked(k loopKey, l *loop) {
	ctx, cancel := context.WithCancel(m.ctx)
	l.cancel = cancel
	s := &syncer{m: m, loop: l, shard: k.shard, domain: k.domain, log: m.opts.Log.WithValues("shard", k.shard, "domain", k.domain)}
	go func() {
		defer close(l.done)
		s.run(ctx)
		m.forget(k, l)
	}()
}

// Missing tells the domain's loop that a reader found no mirror of the
// domain in the shard's cache. A loop that wrote the mirror, or resumed from
// one, reads the API server and writes the mirror again if it is gone:
// deleted by hand, or by this replica's own release of the domain while the
// cache still showed it to the loop that the next binding of the domain
// started. Without it the mirror would stay missing, and the domain's
// bindings pending, until the domain next changes. A reader that finds the
// mirror missing only because the cache has not seen its creation yet costs
// one read of the API server.
func (m *Mirror) Missing(shard int32, domain string) {
	m.mu.Lock()
	l := m.loops[loopKey{shard, domain}]
	m.mu.Unlock()
	if l != nil {
		l.markMissing()
	}
}

// forget removes a loop that ended by itself (its shard was lost).
func (m *Mirror) forget(k loopKey, l *loop) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loops[k] == l {
		delete(m.loops, k)
		mirrorDomains.Dec()
	}
}

// DropShard stops the shard's loops and waits until none can write any
// more: call it before the shard is released.
func (m *Mirror) DropShard(shard int32) {
	m.mu.Lock()
	stopping := map[loopKey]*loop{}
	for k, l := range m.loops {
		if k.shard == shard {
			delete(m.loops, k)
			stopping[k] = l
		}
	}
	m.mu.Unlock()
	mirrorDomains.Sub(float64(len(stopping)))
	stop(stopping)
}

// ReleaseDomain stops mirroring domain for shard and deletes its ExternalDomain, through the
// shard's WriteContext like every write of the shard's objects. A controller calls it when the
// last object of the shard that reads the domain is gone, so that the loops and mirrors follow
// the domains in use instead of every domain the shard ever had. An Ensure while it runs
// mirrors the domain afresh once the old mirror is deleted (a new loop creates a new mirror).
// Releasing a domain that is being released, or whose mirror is already gone, does nothing.
func (m *Mirror) ReleaseDomain(ctx context.Context, shard int32, domain string) error {
	k := loopKey{shard, domain}
	m.mu.Lock()
	if m.releasing[k] != nil {
		m.mu.Unlock()
		return nil
	}
	rel := &release{}
	m.releasing[k] = rel
	l := m.loops[k]
	if l != nil {
		delete(m.loops, k)
		mirrorDomains.Dec()
	}
	m.mu.Unlock()

	if l != nil {
		// Its last write ends before the delete: a write after it would create the mirror again.
		stop(map[loopKey]*loop{k: l})
	}
	err := m.deleteMirror(ctx, shard, domain)

	m.mu.Lock()
	delete(m.releasing, k)
	if rel.again && m.opts.Shards.Holds(shard) {
		m.ensureLocked(k)
	}
	m.mu.Unlock()
	return err
}

// deleteMirror deletes the domain's ExternalDomain while the shard is held. The fencing policy
// of deploy/base admits the delete only from the holder of the shard's Lease, by the mirror's
// shard label.
func (m *Mirror) deleteMirror(ctx context.Context, shard int32, domain string) error {
	wctx, done, ok := m.opts.Shards.WriteContext(ctx, shard)
	if !ok {
		// No longer held: the next holder collects the mirror.
		return nil
	}
	defer done()
	err := m.opts.Client.Delete(wctx, &configv1alpha1.ExternalDomain{ObjectMeta: metav1.ObjectMeta{Name: domain}})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		mirrorWrites.WithLabelValues("error").Inc()
		return fmt.Errorf("deleting ExternalDomain %s: %w", domain, err)
	}
	mirrorWrites.WithLabelValues("ok").Inc()
	m.opts.Log.V(1).Info("Deleted the mirror of a domain no binding of the shard uses", "shard", shard, "domain", domain)
	return nil
}

// stop cancels loops and waits for the started ones to end.
func stop(loops map[loopKey]*loop) {
	for _, l := range loops {
		if l.cancel != nil {
			l.cancel()
		}
	}
	for _, l := range loops {
		if l.cancel != nil {
			<-l.done
		}
	}
}

// Domains lists the domains mirrored for a shard, sorted: a controller checks them for objects
// left when one of the shard's objects goes (ReleaseDomain). They are the domains it runs a loop
// for and those with an ExternalDomain of its ring in the shard's cache: a mirror an earlier
// holder of the shard wrote is this replica's to collect, though it never mirrored the domain.
func (m *Mirror) Domains(ctx context.Context, shard int32) ([]string, error) {
	m.mu.Lock()
	var out []string
	for k := range m.loops {
		if k.shard == shard {
			out = append(out, k.domain)
		}
	}
	m.mu.Unlock()
	if reader, ok := m.opts.Shards.Reader(shard); ok {
		var list configv1alpha1.ExternalDomainList
		if err := reader.List(ctx, &list, client.MatchingLabels{
			sharding.LabelShard: strconv.Itoa(int(shard)), sharding.LabelRing: m.opts.Ring,
		}); err != nil {
			return nil, fmt.Errorf("listing the mirrors of shard %d: %w", shard, err)
		}
		for _, ed := range list.Items {
			out = append(out, ed.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
