package authzcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	"github.com/kshard/kshard/internal/backoff"
)

// Question asks whether a namespace may read a domain.
type Question struct {
	Namespace, Domain string
}

func (q Question) String() string { return q.Namespace + "→" + q.Domain }

// Decision is the authorization system's answer to a Question.
type Decision struct {
	// Allowed says the namespace may read the domain.
	Allowed bool
	// Missing names, when not Allowed, the grant that would allow it, in
	// the Checker's words (e.g. "configdomain:payments#reader@kubernetes/
	// namespace:team-a, directly or through a team").
	Missing string
	// Revision is the authorization system's revision the answer was
	// checked at (opaque).
	Revision string
}

// State says how far a Decision can be trusted.
type State int

const (
	// Unknown: no answer yet; a check is queued, and OnChange tells when it
	// arrives.
	Unknown State = iota
	// Fresh: the answer as of the last change the Watcher reported.
	Fresh
	// Stale: the relationships changed since (or the Watcher failed), and
	// the check again is queued; the answer is the last one.
	Stale
)

func (s State) String() string {
	switch s {
	case Fresh:
		return "Fresh"
	case Stale:
		return "Stale"
	default:
		return "Unknown"
	}
}

// Checker answers questions in bulk, one Decision per Question in order.
// atLeast, when not empty, is a revision the answers must be at least as
// fresh as; empty asks for fully consistent answers.
type Checker interface {
	Check(ctx context.Context, qs []Question, atLeast string) ([]Decision, error)
}

// Watcher follows the authorization system's relationship changes from
// revision from ("" for now), calling changed with the revision of each,
// until ctx ends or it fails. It fails with ErrResumeRefused when the
// system cannot resume from from (its history is gone: compacted, or an
// in-memory store restarted).
type Watcher interface {
	Watch(ctx context.Context, from string, changed func(revision string)) error
}

// ErrResumeRefused is a Watcher's failure to start from a revision; the
// Cache then starts it from now.
var ErrResumeRefused = errors.New("the authorization system cannot resume its changes from that revision")

// Options configure a Cache. Only Checker is required.
type Options struct {
	// Checker answers the questions. Required.
	Checker Checker
	// Watcher reports relationship changes. Optional: without it a
	// decision is checked again only after TTL.
	Watcher Watcher
	// OnChange is called when a question's first answer arrives and when
	// its answer changes, from one goroutine. It must be quick (enqueue).
	OnChange func(Question)
	// TTL is how long a decision stays Fresh without a change reported:
	// a bound on a missed change. Default 10m.
	TTL time.Duration
	// BatchSize is the most questions one Check asks. Default 100
	// (SpiceDB's CheckBulkPermissions default limit is 1,000).
	BatchSize int
	// RateLimit and RateBurst bound the Checks per second. Default 20 and
	// 5.
	RateLimit rate.Limit
	RateBurst int
	// Breaker configures the circuit breaker that stops asking a failing
	// authorization system.
	Breaker BreakerOptions
	// Retry configures the backoff of a failed Check and of a failed
	// Watcher.
	Retry RetryOptions
	// Logger receives the cache's logs. Default: discard.
	Logger logr.Logger
	// Clock is the clock of TTL. Default: the system clock.
	Clock clock.PassiveClock
}

// BreakerOptions configures the circuit breaker, as externalcache's does.
type BreakerOptions struct {
	// ConsecutiveFailures opens the breaker. Default 5.
	ConsecutiveFailures uint32
	// Timeout is how long the breaker stays open before letting a probe
	// through. Default 10s.
	Timeout time.Duration
}

// RetryOptions configures the backoff after a failed Check or Watcher:
// from BaseDelay, doubling up to MaxDelay, each wait up to 20% longer, so
// that replicas that failed together do not retry together.
type RetryOptions struct {
	// BaseDelay is the first wait. Default 100ms.
	BaseDelay time.Duration
	// MaxDelay caps the wait, before its jitter. Default 30s.
	MaxDelay time.Duration
}

func (o *Options) setDefaults() error {
	if o.Checker == nil {
		return errors.New("configuring the authorization cache: a Checker is required")
	}
	if o.TTL <= 0 {
		o.TTL = 10 * time.Minute
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 100
	}
	if o.RateLimit <= 0 {
		o.RateLimit = 20
	}
	if o.RateBurst <= 0 {
		o.RateBurst = 5
	}
	if o.Breaker.ConsecutiveFailures == 0 {
		o.Breaker.ConsecutiveFailures = 5
	}
	if o.Breaker.Timeout <= 0 {
		o.Breaker.Timeout = 10 * time.Second
	}
	if o.Retry.BaseDelay <= 0 {
		o.Retry.BaseDelay = 100 * time.Millisecond
	}
	if o.Retry.MaxDelay <= 0 {
		o.Retry.MaxDelay = 30 * time.Second
	}
	if o.OnChange == nil {
		o.OnChange = func(Question) {}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return nil
}

// entry is one question's kept answer.
type entry struct {
	d       Decision
	known   bool      // d is an answer
	stale   bool      // checked again is queued
	checked time.Time // when d was asked for, by Options.Clock
}

// Cache keeps decisions; Decide never blocks. Run it with Start.
type Cache struct {
	opts    Options
	limiter *rate.Limiter
	breaker *gobreaker.CircuitBreaker[[]Decision]

	mu      sync.Mutex
	entries map[Question]*entry
	// queue holds the questions to check, each once.
	queue map[Question]struct{}
	// atLeast is the revision of the last change reported: checks are
	// asked at least as fresh as it ("" after a Watcher failure: fully
	// consistent).
	atLeast string
	wake    chan struct{}
	// answered is closed, and replaced, whenever answers are stored: it
	// wakes Await.
	answered chan struct{}
	// checks counts the Checks asked and questions the questions in them,
	// for a caller's metrics and tests.
	checks, questions int64
}

// New validates the options and returns a Cache that answers Decide at
// once and checks once Start runs.
func New(opts Options) (*Cache, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	c := &Cache{
		opts:    opts,
		limiter: rate.NewLimiter(opts.RateLimit, opts.RateBurst),
		entries: map[Question]*entry{},
		queue:   map[Question]struct{}{},
		wake:    make(chan struct{}, 1),

		answered: make(chan struct{}),
	}
	c.breaker = gobreaker.NewCircuitBreaker[[]Decision](gobreaker.Settings{
		Name:    "authorization",
		Timeout: opts.Breaker.Timeout,
		ReadyToTrip: func(counts gobreaker.Counts) bool {
			return counts.ConsecutiveFailures >= opts.Breaker.ConsecutiveFailures
		},
		OnStateChange: func(_ string, from, to gobreaker.State) {
			opts.Logger.Info("Authorization circuit breaker changed state", "from", from.String(), "to", to.String())
		},
	})
	return c, nil
}

// NeedLeaderElection is false: every replica decides for its own shards.
func (c *Cache) NeedLeaderElection() bool { return false }

// Decide returns the kept answer to q and how far to trust it, and queues
// a check when there is none or it expired. It never blocks.
func (c *Cache) Decide(q Question) (Decision, State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[q]
	if !ok {
		e = &entry{}
		c.entries[q] = e
		c.enqueueLocked(q)
		return Decision{}, Unknown
	}
	if !e.known {
		return Decision{}, Unknown
	}
	if !e.stale && c.opts.Clock.Now().Sub(e.checked) > c.opts.TTL {
		e.stale = true
		c.enqueueLocked(q)
	}
	if e.stale {
		return e.d, Stale
	}
	return e.d, Fresh
}

// Await is Decide for a caller that may wait (an admission check, not a
// reconcile): an Unknown question waits for its first answer until ctx
// ends, and is then returned as it stands.
func (c *Cache) Await(ctx context.Context, q Question) (Decision, State) {
	for {
		d, st := c.Decide(q)
		if st != Unknown {
			return d, st
		}
		c.mu.Lock()
		answered := c.answered
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return c.Decide(q)
		case <-answered:
		}
	}
}

// Forget drops a question nobody asks any more (its last binding went),
// so that it is not checked again at every change.
func (c *Cache) Forget(q Question) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, q)
	delete(c.queue, q)
}

// Stats are counts since the cache started.
type Stats struct {
	// Decisions is the number of questions kept; Checks the Checks asked
	// and Questions the questions they carried.
	Decisions, Checks, Questions int64
}

// Stats returns the cache's counts.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{Decisions: int64(len(c.entries)), Checks: c.checks, Questions: c.questions}
}

func (c *Cache) enqueueLocked(q Question) {
	c.queue[q] = struct{}{}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// invalidate makes every kept decision stale and queues it, to be checked
// at least as fresh as revision ("": fully consistent).
func (c *Cache) invalidate(revision string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.atLeast = revision
	for q, e := range c.entries {
		e.stale = e.known
		c.enqueueLocked(q)
	}
}

// Start checks queued questions and follows the Watcher until ctx ends.
func (c *Cache) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	if c.opts.Watcher != nil {
		wg.Go(func() { c.follow(ctx) })
	}
	c.checkLoop(ctx)
	wg.Wait()
	return nil
}

// follow runs the Watcher, from where it stopped, until ctx ends. A failed
// Watcher may have missed changes, or its system lost its history (an
// in-memory SpiceDB restarted): every decision goes stale and is checked
// again fully consistently, and the Watcher resumes from the last revision
// it reported. Not from now: a check made between the failure and a new
// Watcher's start could answer before a change that the new one, begun
// after it, would never report. Only a resume the system refuses starts
// from now, where the first answer makes every decision stale again.
func (c *Cache) follow(ctx context.Context) {
	delays := c.retryPolicy().Delays()
	from := ""
	for ctx.Err() == nil {
		err := c.opts.Watcher.Watch(ctx, from, func(revision string) {
			delays.Reset()
			from = revision
			c.invalidate(revision)
		})
		if ctx.Err() != nil {
			return
		}
		d := delays.Next()
		c.opts.Logger.Info("Following the authorization system's changes failed; every decision is checked again", "error", fmt.Sprint(err), "from", from, "retryIn", d)
		if errors.Is(err, ErrResumeRefused) {
			from = ""
		}
		c.invalidate("")
		if !sleep(ctx, d) {
			return
		}
	}
}

// checkLoop asks the queued questions in batches.
func (c *Cache) checkLoop(ctx context.Context) {
	delays := c.retryPolicy().Delays()
	for {
		batch, atLeast := c.take()
		if len(batch) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
				continue
			}
		}
		if err := c.limiter.Wait(ctx); err != nil {
			return
		}
		asked := c.opts.Clock.Now()
		ds, err := c.breaker.Execute(func() ([]Decision, error) {
			ds, err := c.opts.Checker.Check(ctx, batch, atLeast)
			if err == nil && len(ds) != len(batch) {
				err = fmt.Errorf("the authorization system answered %d of %d questions", len(ds), len(batch))
			}
			return ds, err
		})
		c.mu.Lock()
		c.checks++
		c.questions += int64(len(batch))
		c.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := delays.Next()
			c.opts.Logger.Info("Checking authorization failed", "questions", len(batch), "error", err.Error(), "retryIn", d)
			c.requeue(batch)
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		delays.Reset()
		for _, q := range c.store(batch, ds, asked, atLeast) {
			c.opts.OnChange(q)
		}
	}
}

// take removes up to BatchSize queued questions, in no order: after a
// change every kept question is queued, and a sort per batch would cost
// the whole queue each time.
func (c *Cache) take() ([]Question, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	qs := make([]Question, 0, min(len(c.queue), c.opts.BatchSize))
	for q := range c.queue {
		if len(qs) == c.opts.BatchSize {
			break
		}
		qs = append(qs, q)
		delete(c.queue, q)
	}
	return qs, c.atLeast
}

func (c *Cache) requeue(qs []Question) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range qs {
		if _, ok := c.entries[q]; ok {
			c.enqueueLocked(q)
		}
	}
}

// store keeps the answers and returns the questions whose answer arrived
// or changed. An answer checked before a later invalidation stays stale:
// the question is queued again.
func (c *Cache) store(qs []Question, ds []Decision, asked time.Time, atLeast string) []Question {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.answered)
	c.answered = make(chan struct{})
	var changed []Question
	for i, q := range qs {
		e, ok := c.entries[q]
		if !ok {
			continue // forgotten meanwhile
		}
		if !e.known || e.d.Allowed != ds[i].Allowed || e.d.Missing != ds[i].Missing {
			changed = append(changed, q)
		}
		e.d, e.known, e.checked = ds[i], true, asked
		_, requeued := c.queue[q]
		e.stale = requeued || c.atLeast != atLeast
		if e.stale && !requeued {
			c.enqueueLocked(q)
		}
	}
	return changed
}

// retryPolicy spaces the tries of a failed Check or Watcher (RetryOptions).
func (c *Cache) retryPolicy() backoff.Policy {
	return backoff.Policy{Initial: c.opts.Retry.BaseDelay, Max: c.opts.Retry.MaxDelay, Jitter: 0.2}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
