package audit

import (
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/kshard/kshard/sharding"
)

// Sync is one initial sync of an informer, as the API server served it: a
// LIST it answered 200, or the start of a streaming watch-list (a WATCH
// with sendInitialEvents=true, how client-go 1.35 and later sync). Either
// scans the whole collection: a relist costs what a first sync does.
type Sync struct {
	// Resource is the resource listed: "configbindings", "leases".
	Resource string
	// Group names the informer within its process: the request's path
	// (its namespace) and its label and field selectors. kshard's shard
	// caches select `kshard.dev/shard in (set)`, one cache per set.
	Group string
	// Shards is the shard set the label selector names, nil for an
	// informer that selects no shards (the labeler's, the ring's Leases).
	Shards []int32
	// ClusterWide says the request named no namespace, as the API
	// server's metrics tell it (their scope "cluster").
	ClusterWide bool
	// Username and Holder are who synced, as for a Write.
	Username, Holder string
	// Received is when the API server received the request.
	Received time.Time
}

// syncOf reads an audit event as an initial sync, if it is one.
func syncOf(ev *event) (Sync, bool) {
	if ev.ObjectRef == nil || ev.ObjectRef.Name != "" || ev.ResponseStatus == nil || ev.ResponseStatus.Code != 200 {
		return Sync{}, false
	}
	path, rawQuery, _ := strings.Cut(ev.RequestURI, "?")
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return Sync{}, false
	}
	switch {
	case ev.Verb == "list" && ev.Stage == "ResponseComplete":
	case ev.Verb == "watch" && ev.Stage == "ResponseStarted" && q.Get("sendInitialEvents") == "true":
	default:
		return Sync{}, false
	}
	if q.Get("dryRun") != "" {
		return Sync{}, false
	}
	s := Sync{
		Resource:    ev.ObjectRef.Resource,
		Group:       path + "?labelSelector=" + q.Get("labelSelector") + "&fieldSelector=" + q.Get("fieldSelector"),
		ClusterWide: !strings.Contains(path, "/namespaces/"),
		Username:    ev.User.Username,
		Received:    ev.Received.Time,
	}
	s.Holder, _ = HolderOf(ev.UserAgent)
	s.Shards = shardsSelected(q.Get("labelSelector"))
	return s, true
}

// shardsSelected returns the shards a label selector's `kshard.dev/shard
// in (…)` or `=` requirement names, nil if it has none.
func shardsSelected(selector string) []int32 {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil
	}
	reqs, _ := sel.Requirements()
	for _, r := range reqs {
		if r.Key() != sharding.LabelShard {
			continue
		}
		switch r.Operator() {
		case selection.In, selection.Equals, selection.DoubleEquals:
		default:
			continue
		}
		var out []int32
		for v := range r.Values() {
			if n, err := strconv.ParseInt(v, 10, 32); err == nil {
				out = append(out, int32(n))
			}
		}
		slices.Sort(out)
		return out
	}
	return nil
}

// RelistOptions say which syncs CheckRelists reads.
type RelistOptions struct {
	// Ring names the ring whose Leases grant the shards. Required.
	Ring string
	// LeaseNamespace holds the ring's Leases. Required.
	LeaseNamespace string
	// From and To bound the window (the API server's receive times): a
	// fault and the recovery after it.
	From, To time.Time
}

// CacheGroupSyncs is what one informer of one replica process synced in a
// window.
type CacheGroupSyncs struct {
	Holder, Resource, Group string
	// ClusterWide says its requests named no namespace.
	ClusterWide bool
	// Syncs are its initial syncs in the window.
	Syncs int
	// Acquired says whether the process acquired a Lease that grants the
	// informer's shards (any of the ring's Leases, for an informer that
	// selects no shards) in the window: a cache started for an
	// acquisition syncs once more, and legitimately.
	Acquired bool
}

// Allowed is the syncs the informer may make in the window: one relist,
// and one more after an acquisition.
func (g CacheGroupSyncs) Allowed() int {
	if g.Acquired {
		return 2
	}
	return 1
}

func (g CacheGroupSyncs) String() string {
	return fmt.Sprintf("%s synced %s %s %d times (acquired in the window: %v)", g.Holder, g.Resource, g.Group, g.Syncs, g.Acquired)
}

// Relists is what the API server's audit log says of the replicas'
// initial syncs in a window.
type Relists struct {
	// ByHolder counts the syncs of each replica process in the window.
	ByHolder map[string]int
	// Groups are the informers that synced in the window.
	Groups []CacheGroupSyncs
	// Excess are the informers that synced more than Allowed: a relist
	// loop, or a fault turned into a LIST storm.
	Excess []CacheGroupSyncs
	// AllowedClusterWide sums, per resource, what the cluster-wide
	// informers that synced in the window may sync (Allowed): the bound of
	// the syncs the API server itself counted as completed at cluster scope
	// (an audit event of a watch-list shows its start, not whether its
	// initial events ended, so an attempt the server ends early reads as
	// a sync here).
	AllowedClusterWide map[string]int
	// OthersClusterWide counts, per resource, the cluster-wide syncs other
	// clients started in the window (a controller manager's garbage
	// collector lists every resource): the server counts their completed
	// syncs too, at most these.
	OthersClusterWide map[string]int
}

// OK reports whether no informer synced more than it may.
func (r *Relists) OK() bool { return len(r.Excess) == 0 }

// Total is the replicas' syncs in the window.
func (r *Relists) Total() int {
	n := 0
	for _, c := range r.ByHolder {
		n += c
	}
	return n
}

func (r *Relists) String() string {
	var b strings.Builder
	holders := make([]string, 0, len(r.ByHolder))
	for h := range r.ByHolder {
		holders = append(holders, h)
	}
	sort.Strings(holders)
	groups := map[string]int{}
	for _, g := range r.Groups {
		groups[g.Holder]++
	}
	fmt.Fprintf(&b, "%d initial syncs by replicas:", r.Total())
	for _, h := range holders {
		fmt.Fprintf(&b, " %s %d of %d informers;", h, r.ByHolder[h], groups[h])
	}
	fmt.Fprintf(&b, " %d informers synced more than once (twice after an acquisition)", len(r.Excess))
	for i, g := range r.Excess {
		if i == 10 {
			fmt.Fprintf(&b, "\n  … %d more", len(r.Excess)-i)
			break
		}
		fmt.Fprintf(&b, "\n  %s", g)
	}
	return b.String()
}

// CheckRelists counts the initial syncs each replica process (each holder
// identity) made in a window, by informer, and names the informers that
// synced more than once, or more than twice when the process acquired the
// informer's shards in the window: after a fault that breaks every watch
// (an API server or etcd restart, a partition), an informer that resumes
// its watch syncs nothing, one whose resourceVersion is gone relists once,
// and anything more is a relist loop the API server pays for.
func CheckRelists(l *APILog, opts RelistOptions) *Relists {
	in := func(t time.Time) bool { return !t.Before(opts.From) && !t.After(opts.To) }
	// acquired[holder] are the shards each holder acquired in the window;
	// anyLease[holder] whether it acquired any Lease of the ring. An
	// acquisition writes a new holder or a new acquire time: a replica that
	// lost a Lease while the API server was away takes it again under its
	// own name, and starts its caches again.
	acquired := map[string]map[int32]bool{}
	anyLease := map[string]bool{}
	type lease struct {
		holder   string
		acquired time.Time
	}
	last := map[string]lease{}
	for _, w := range l.Writes {
		if w.Resource != "leases" || w.Namespace != opts.LeaseNamespace || !w.committed() || !strings.HasPrefix(w.Name, opts.Ring+"-") {
			continue
		}
		prev := last[w.Name]
		last[w.Name] = lease{w.LeaseHolder, w.LeaseAcquired}
		if w.LeaseHolder == "" || (w.LeaseHolder == prev.holder && w.LeaseAcquired.Equal(prev.acquired)) || !in(w.Received) {
			continue
		}
		anyLease[w.LeaseHolder] = true
		if n, ok := parseShardLease(opts.Ring, w.Name); ok {
			if acquired[w.LeaseHolder] == nil {
				acquired[w.LeaseHolder] = map[int32]bool{}
			}
			acquired[w.LeaseHolder][n] = true
		}
	}
	r := &Relists{ByHolder: map[string]int{}, AllowedClusterWide: map[string]int{}, OthersClusterWide: map[string]int{}}
	index := map[string]int{}
	for _, s := range l.Syncs {
		if !in(s.Received) {
			continue
		}
		if s.Holder == "" {
			if s.ClusterWide {
				r.OthersClusterWide[s.Resource]++
			}
			continue
		}
		r.ByHolder[s.Holder]++
		k := s.Holder + " " + s.Resource + " " + s.Group
		i, ok := index[k]
		if !ok {
			g := CacheGroupSyncs{Holder: s.Holder, Resource: s.Resource, Group: s.Group, ClusterWide: s.ClusterWide, Acquired: anyLease[s.Holder] && s.Shards == nil}
			for _, n := range s.Shards {
				if acquired[s.Holder][n] {
					g.Acquired = true
				}
			}
			i = len(r.Groups)
			index[k] = i
			r.Groups = append(r.Groups, g)
		}
		r.Groups[i].Syncs++
	}
	for _, g := range r.Groups {
		if g.Syncs > g.Allowed() {
			r.Excess = append(r.Excess, g)
		}
		if g.ClusterWide {
			r.AllowedClusterWide[g.Resource] += g.Allowed()
		}
	}
	return r
}
