package sharding

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/kshard/kshard/sharding/lease"
	"github.com/kshard/kshard/sharding/ring"
)

// A warm leave. A replica that leaves the ring hands its shards to replicas
// that have none of their objects cached, and each new owner's first
// reconcile waits for a cache of its own to sync: a LIST or watch-list that
// scans the whole collection, 9–13 s at 100,000 objects on the scale
// scenario's machine (docs/scale.md), while nobody runs the shards. So the
// leaving replica first says so on its member Lease (Keys.Leaving) and keeps
// running its shards. Every replica then computes the ring without it; one
// that the ring gives some of its shards starts a cache of just those (a
// warm-up), and says on its own member Lease when it synced (Keys.WarmFor).
// The leaving replica then releases its shards as before, and each new
// owner's acquisition joins the synced cache at once (rejoin), enqueueing
// the shard's objects.

// warmup is a cache this replica syncs for the shards it will take from
// leaving members, before they release them.
type warmup struct {
	// leavers are the leaving members it warms for, sorted; shards the
	// shards it takes from them, sorted.
	leavers []string
	shards  []int32
	// g is its cache once synced; cancelled ends a warm-up not synced yet.
	g         *group
	cancelled chan struct{}
}

// warmLocked starts, replaces or ends this replica's warm-up from the ring
// as last read: the shards the ring (computed without the leaving members)
// gives this replica that a leaving member holds. A shard a leaving member
// released stays in the warm-up until this replica runs it: the releases
// come one by one, and a warm-up ended at the first would leave the others
// to start cold. So a warm-up is replaced only when a leaving member holds a
// shard it lacks (with the shards it still waits for), and ends once no
// leaving member holds one of its shards and every one of them this replica
// still wants runs (it joined the cache, or another): its cache lives on
// with the shards that joined it. Caller holds c.mu.
func (c *coordinator) warmLocked(ctx context.Context, view *ring.View, current *ring.Ring) {
	me := c.opts.Identity
	var gains []int32
	var leavers []string
	for n := range c.opts.Shards {
		l, ok := view.Shards[n]
		if !ok || current.Owner(n) != me {
			continue
		}
		if from := lease.HolderReplica(l.Holder); slices.Contains(view.Leaving, from) {
			gains = append(gains, n)
			if !slices.Contains(leavers, from) {
				leavers = append(leavers, from)
			}
		}
	}
	slices.Sort(leavers)
	w := c.warm
	if w != nil {
		waiting := c.waitingLocked(w, current)
		if !isSubset(gains, w.shards) {
			gains = slices.Compact(slices.Sorted(slices.Values(append(gains, waiting...))))
			c.endWarmupLocked(w)
		} else {
			if len(gains) == 0 && len(waiting) == 0 {
				c.endWarmupLocked(w)
			} else if len(leavers) > 0 && !slices.Equal(w.leavers, leavers) {
				w.leavers = leavers
				if w.g != nil {
					c.member.say(c.keys.WarmFor, strings.Join(leavers, ","))
				}
			}
			return
		}
	}
	if len(gains) == 0 {
		return
	}
	w = &warmup{leavers: leavers, shards: gains, cancelled: make(chan struct{})}
	c.warm = w
	go c.startWarmup(context.WithoutCancel(ctx), w)
}

// waitingLocked lists the shards of warm-up w that the ring gives this
// replica and that it does not run yet. Caller holds c.mu.
func (c *coordinator) waitingLocked(w *warmup, current *ring.Ring) []int32 {
	var out []int32
	for _, n := range w.shards {
		if current.Owner(n) != c.opts.Identity {
			continue
		}
		if s, ok := c.shards[n]; !ok || !s.active() {
			out = append(out, n)
		}
	}
	return out
}

// isSubset reports whether every element of a is in sorted b.
func isSubset(a, b []int32) bool {
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			return false
		}
	}
	return true
}

// endWarmupLocked ends warm-up w: its cache stops unless shards joined it.
// Caller holds c.mu.
func (c *coordinator) endWarmupLocked(w *warmup) {
	c.warm = nil
	close(w.cancelled)
	c.member.say(c.keys.WarmFor, "")
	if g := w.g; g != nil {
		g.mu.Lock()
		g.warming = false
		g.mu.Unlock()
		// leave stops the cache when it is the last member, and takes
		// c.mu to forget it.
		go g.leave()
	}
}

// startWarmup creates and starts the cache of warm-up w and, once it
// synced, offers it to the shards' acquisitions (rejoin) and says so on the
// member Lease.
func (c *coordinator) startWarmup(ctx context.Context, w *warmup) {
	select {
	case <-c.queue.ready:
	case <-w.cancelled:
		return
	}
	g, err := c.newGroup(ctx, slices.Clone(w.shards))
	if err != nil {
		c.log.Error(err, "Creating the cache of a warm leave; the shards will start cold", "shards", w.shards, "leaving", w.leavers)
		return
	}
	g.members = 1 // the warm-up itself, until it ends
	g.warming = true
	c.metrics.caches.WithLabelValues("warm-up").Inc()
	started := time.Now()
	g.start()
	select {
	case <-g.synced:
	case <-w.cancelled:
		g.leave()
		return
	case <-g.done:
		return
	}
	c.mu.Lock()
	if c.warm != w {
		c.mu.Unlock()
		g.leave()
		return
	}
	w.g = g
	c.groups[g] = true
	leavers := strings.Join(w.leavers, ",")
	c.mu.Unlock()
	c.log.Info("Synced the cache of shards a leaving replica hands over", "shards", w.shards, "leaving", leavers, "took", time.Since(started))
	c.member.say(c.keys.WarmFor, leavers)
}

// coldSuccessors lists the replicas that the ring without the leaving
// members (this one among them) gives some of this replica's shards and
// that have not said yet that they synced a cache of them. None when no
// member stays.
func (c *coordinator) coldSuccessors(ctx context.Context) ([]string, error) {
	view, err := c.read(ctx, time.Now())
	if err != nil {
		return nil, err
	}
	me := c.opts.Identity
	stay := slices.DeleteFunc(slices.Clone(view.Members), func(m string) bool { return m == me || slices.Contains(view.Leaving, m) })
	next := ring.New(c.opts.Shards, stay)
	var cold []string
	for _, n := range c.heldShards() {
		if s := next.Owner(n); s != "" && !slices.Contains(cold, s) && !slices.Contains(view.WarmFor[s], me) {
			cold = append(cold, s)
		}
	}
	return cold, nil
}

// staying counts the live members other than this replica that do not
// leave: none of them announces it, and stays (the StatefulSet's count)
// does not say they go too.
func (c *coordinator) staying(ctx context.Context, stays func(string) bool) (int, error) {
	view, err := c.read(ctx, time.Now())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range view.Members {
		if m != c.opts.Identity && !slices.Contains(view.Leaving, m) && stays(m) {
			n++
		}
	}
	return n, nil
}
