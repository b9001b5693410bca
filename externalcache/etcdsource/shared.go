package etcdsource

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kshard/kshard/externalcache"
)

// shared is the one etcd watch a Source follows its domains with (unless
// Options.WatchPerPoll): it follows the whole prefix from the revision
// after the first list's, keeps the last events of every domain (names and
// revisions, not values) in a bounded log, and answers each domain's polls
// from it, as kube-apiserver's watch cache
// answers its watchers from one watch of etcd. A poll never makes a watch
// of its own unless it asks for a revision the log no longer holds; etcd
// then keeps one watcher per replica however many domains it follows, and
// never catches a new watcher up on past revisions.
type shared struct {
	s *Source

	mu sync.Mutex
	// running: the watch goroutine is up; err: why it stopped, for the
	// polls waiting then.
	running bool
	err     error
	// asked is when a poll last asked etcd for the watch's progress.
	asked time.Time
	// Every event of the prefix after trimmed up to rev is in the log.
	rev, trimmed int64
	// epoch is the cluster's ID, from the first list on, so that an idle
	// poll answered before the watch's first answer names the history.
	epoch string
	// byDomain are the log's events per domain, in revision order; revs
	// every event's revision in order, to find where to trim.
	byDomain map[string][]externalcache.Change
	revs     []int64
	// wake has a channel per domain with waiting polls, closed when one of
	// its events arrives or the watch stops.
	wake map[string]chan struct{}
}

func newShared(s *Source) *shared {
	return &shared{s: s, byDomain: map[string][]externalcache.Change{}, wake: map[string]chan struct{}{}}
}

// changes answers a poll of domain after since (> 0) from the log: with
// the domain's events after since as soon as there are some, or, after
// PollTimeout with none, with the revision up to which the log shows none.
func (h *shared) changes(ctx context.Context, domain string, since int64) (externalcache.ChangeSet, error) {
	idle := time.NewTimer(h.s.opts.PollTimeout)
	defer idle.Stop()
	expired := false
	for {
		h.mu.Lock()
		if err := h.err; err != nil && !h.running {
			// The watch stopped: one poll says why, the next starts it again.
			h.err = nil
			h.mu.Unlock()
			return externalcache.ChangeSet{}, err
		}
		if !h.running {
			if err := h.s.opts.Client.Ctx().Err(); err != nil {
				h.mu.Unlock()
				return externalcache.ChangeSet{}, fmt.Errorf("following domain %s in etcd: the client is closed: %w", domain, err)
			}
			h.start(since)
		}
		if since < h.trimmed {
			// Older than the log: a watch of this poll's own reads
			// etcd's history, or learns it is compacted.
			h.mu.Unlock()
			return h.s.watchDomain(ctx, domain, since)
		}
		evs := h.byDomain[domain]
		i := sort.Search(len(evs), func(i int) bool { return evs[i].Revision > since })
		if i < len(evs) || expired {
			cs := externalcache.ChangeSet{Revision: max(h.rev, since), Epoch: h.epoch, Changes: append([]externalcache.Change(nil), evs[i:]...)}
			ask := expired && h.askProgress()
			h.mu.Unlock()
			if ask {
				// An idle log: etcd's progress notification moves it to
				// etcd's revision, for the polls to come. One request per
				// PollTimeout serves all of them.
				if err := h.s.opts.Client.RequestProgress(clientv3.WithRequireLeader(context.WithoutCancel(ctx))); err != nil {
					return externalcache.ChangeSet{}, classify("asking etcd for the shared watch's progress", err)
				}
			}
			return cs, nil
		}
		wake, ok := h.wake[domain]
		if !ok {
			wake = make(chan struct{})
			h.wake[domain] = wake
		}
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			return externalcache.ChangeSet{}, ctx.Err()
		case <-wake:
		case <-idle.C:
			expired = true
		}
	}
}

// askProgress says whether to ask etcd for a progress notification: not
// if one was asked for within the last PollTimeout. Called with mu held.
func (h *shared) askProgress() bool {
	if now := time.Now(); now.Sub(h.asked) >= h.s.opts.PollTimeout {
		h.asked = now
		return true
	}
	return false
}

// startAfter starts the watch from the revision after rev, a list's of
// the cluster named epoch, unless it runs.
func (h *shared) startAfter(rev int64, epoch string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.epoch == "" {
		h.epoch = epoch
	}
	if !h.running && h.err == nil {
		h.start(rev)
	}
}

// start starts the watch from the revision after since. Called with mu
// held.
func (h *shared) start(since int64) {
	h.running, h.err = true, nil
	h.rev, h.trimmed = since, since
	h.byDomain, h.revs = map[string][]externalcache.Change{}, nil
	// The watch outlives any one poll: it ends when the client closes.
	ctx := clientv3.WithRequireLeader(context.Background())
	w := h.s.opts.Client.Watch(ctx, h.s.opts.Prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(since+1), clientv3.WithProgressNotify())
	go h.follow(w)
}

// follow takes the watch's answers into the log until it ends. A watch
// from a compacted revision starts again from the oldest one etcd keeps:
// the polls from before it fall back to watches of their own, which learn
// the history is lost and list their domains again.
func (h *shared) follow(w clientv3.WatchChan) {
	for resp := range w {
		if resp.CompactRevision != 0 {
			h.mu.Lock()
			h.wakeAll()
			h.start(resp.CompactRevision - 1)
			h.mu.Unlock()
			return
		}
		if err := resp.Err(); err != nil {
			h.stop(classify("the shared watch of "+h.s.opts.Prefix+" in etcd", err))
			return
		}
		h.take(resp)
	}
	h.stop(fmt.Errorf("the shared watch of %s in etcd closed: %w", h.s.opts.Prefix, errUnavailable))
}

// take appends a watch answer's events, and moves rev to what the answer
// shows complete.
func (h *shared) take(resp clientv3.WatchResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.epoch = epoch(resp.Header.ClusterId)
	prefix := h.s.opts.Prefix + "/"
	for _, ev := range resp.Events {
		rest := strings.TrimPrefix(string(ev.Kv.Key), prefix)
		domain, name, ok := strings.Cut(rest, "/")
		if !ok {
			continue // a key directly under the prefix: in no domain
		}
		h.byDomain[domain] = append(h.byDomain[domain], externalcache.Change{Name: name, Revision: ev.Kv.ModRevision, Deleted: ev.Type == mvccpb.DELETE})
		h.revs = append(h.revs, ev.Kv.ModRevision)
		h.rev = max(h.rev, ev.Kv.ModRevision)
		if wake, ok := h.wake[domain]; ok {
			close(wake)
			delete(h.wake, domain)
		}
	}
	if len(resp.Events) == 0 && resp.IsProgressNotify() {
		// Every event up to the header's revision was sent.
		h.rev = max(h.rev, resp.Header.Revision)
	}
	if n := len(h.revs); n > h.s.opts.SharedLogEvents {
		h.trim(h.revs[n/2])
	}
}

// trim drops the events at or below cut. Called with mu held.
func (h *shared) trim(cut int64) {
	for d, evs := range h.byDomain {
		i := sort.Search(len(evs), func(i int) bool { return evs[i].Revision > cut })
		if i == len(evs) {
			delete(h.byDomain, d)
			continue
		}
		h.byDomain[d] = append([]externalcache.Change(nil), evs[i:]...)
	}
	i := sort.Search(len(h.revs), func(i int) bool { return h.revs[i] > cut })
	h.revs = append([]int64(nil), h.revs[i:]...)
	h.trimmed = cut
}

// stop records why the watch ended and wakes every waiting poll; the next
// poll starts the watch again from its own revision.
func (h *shared) stop(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running, h.err = false, err
	h.wakeAll()
}

// wakeAll wakes every waiting poll. Called with mu held.
func (h *shared) wakeAll() {
	for d, wake := range h.wake {
		close(wake)
		delete(h.wake, d)
	}
}
