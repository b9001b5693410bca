package sharding

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// maxShardTableBytes bounds the table's domain names and shard numbers
// together. The API server counts only a ConfigMap's values against its 1
// MiB, but etcd takes at most 1.5 MiB in one request (its default
// --max-request-bytes), and each entry costs a few bytes more once stored:
// 1 MiB of names and numbers keeps the object below that.
const maxShardTableBytes = 1 << 20

// shardTableFlushInterval spaces the table's writes: the domains a create
// storm brings in one interval cost one patch.
const shardTableFlushInterval = 200 * time.Millisecond

// shardTable is the ring's record of the domains its labeler has labeled,
// each with its shard: a ConfigMap in the Lease namespace (Options.ShardTable)
// that deploy/base's kshard-shard-label MutatingAdmissionPolicy takes as its
// params. The API server then stamps the shard label on the CREATE of an
// object whose domain is in the table, and the object costs no label patch
// and no wait for the labeler; an object of a domain not in it yet is
// labeled by the labeler as before, and its domain added.
//
// Only the labeler writes it, during its term (deploy/base's
// kshard-labeler-writes policy refuses anyone else), with merge patches of
// the new entries, each conditional on the resourceVersion this term last
// read or wrote: a table that changed meanwhile (a person's edit, the write
// of a labeler whose term overlapped this one's) is read again before it is
// written, never overwritten from a stale read. A table of another shard
// count is started afresh. A table that reaches
// maxShardTableBytes takes no more domains, which the labeler keeps labeling
// (kshard_shard_table_full says so); a table deleted meanwhile is written
// again, whole, by the next flush.
type shardTable struct {
	env  *env
	name string
	log  logr.Logger
	// rv is the table's resourceVersion as this term last read or wrote
	// it, "" when it did not exist; only run's goroutine uses it.
	rv string

	mu      sync.Mutex
	entries map[string]int32 // in the table, as last read or written
	pending map[string]int32 // labeled, not yet in the table
	bytes   int              // of entries' and pending's names and numbers
	full    bool
	// recheck: an object of a domain in the table came unlabeled, so the
	// table may be gone (or the policy not installed, or its params not
	// current yet); checked at most once per shardTableRecheckInterval, and
	// a recheck asked for sooner waits for it (dropping it would leave a
	// deleted table unwritten until another such object came).
	recheck     bool
	lastChecked time.Time
	wake        chan struct{}
}

// shardTableRecheckInterval spaces the reads of the table that an
// unlabeled object of a known domain asks for: in a create storm, many are
// created before the API server's policy sees the entry that labels them.
const shardTableRecheckInterval = 10 * time.Second

func newShardTable(e *env) *shardTable {
	return &shardTable{
		env: e, name: e.opts.ShardTable, log: e.log.WithName("shard-table").WithValues("configMap", e.opts.ShardTable),
		entries: map[string]int32{}, pending: map[string]int32{}, wake: make(chan struct{}, 1),
	}
}

// load reads the table at the start of a term, and starts afresh one of
// another shard count. A table that does not exist is created by the first
// flush.
func (t *shardTable) load(ctx context.Context) error {
	var cm corev1.ConfigMap
	err := t.env.mgr.GetAPIReader().Get(ctx, types.NamespacedName{Namespace: t.env.opts.LeaseNamespace, Name: t.name}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		t.rv = ""
		t.log.Info("No shard table yet; writing one as domains are labeled")
		return nil
	case err != nil:
		return fmt.Errorf("reading shard table %s/%s: %w", t.env.opts.LeaseNamespace, t.name, err)
	}
	// The table's <prefix>/shards annotation records the shard count its
	// entries were computed with. A labeler of another count starts the
	// table afresh, so the admission policy never labels by a count the
	// ring left.
	if got := cm.Annotations[t.env.keys.Shards]; got != strconv.Itoa(int(t.env.opts.Shards)) {
		t.log.Info("Shard table of another shard count; starting it afresh", "tableShards", got, "shards", t.env.opts.Shards)
		return t.reset(ctx, &cm)
	}
	t.rv = cm.ResourceVersion
	t.mu.Lock()
	defer t.mu.Unlock()
	// Read whole: a table read again after it changed keeps none of what
	// this term knew of it, but what it has yet to write.
	t.entries, t.bytes = map[string]int32{}, 0
	for domain, n := range t.pending {
		if _, ok := cm.Data[domain]; !ok {
			t.bytes += len(domain) + len(strconv.Itoa(int(n)))
		}
	}
	for domain, v := range cm.Data {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || int32(n) != ShardOf(domain, t.env.opts.Shards) {
			// Someone edited it: the next flush writes the right shard.
			t.pending[domain] = ShardOf(domain, t.env.opts.Shards)
		} else {
			t.entries[domain] = int32(n)
		}
		t.bytes += len(domain) + len(v)
	}
	t.full = t.bytes >= maxShardTableBytes
	t.env.metrics.tableDomains.Set(float64(len(t.entries)))
	t.env.metrics.tableFull.Set(boolGauge(t.full))
	if len(t.pending) > 0 {
		t.kickLocked()
	}
	return nil
}

// reset replaces a table of another shard count with an empty one.
func (t *shardTable) reset(ctx context.Context, cm *corev1.ConfigMap) error {
	cm.Data, cm.BinaryData = nil, nil
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[t.env.keys.Shards] = strconv.Itoa(int(t.env.opts.Shards))
	if err := t.env.writer.Update(ctx, cm); err != nil {
		return fmt.Errorf("starting shard table %s/%s afresh: %w", cm.Namespace, cm.Name, err)
	}
	t.rv = cm.ResourceVersion
	t.mu.Lock()
	t.entries = map[string]int32{}
	t.bytes = 0
	for domain, n := range t.pending {
		t.bytes += len(domain) + len(strconv.Itoa(int(n)))
	}
	t.mu.Unlock()
	return nil
}

// add records a domain the labeler labeled. It never blocks.
func (t *shardTable) add(domain string, shard int32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.entries[domain]; ok {
		if !t.recheck {
			t.recheck = true
			t.kickLocked()
		}
		return
	}
	if _, ok := t.pending[domain]; ok {
		return
	}
	size := len(domain) + len(strconv.Itoa(int(shard)))
	if t.bytes+size > maxShardTableBytes {
		if !t.full {
			t.full = true
			t.env.metrics.tableFull.Set(1)
			t.log.Info("Shard table full: domains new to it are labeled by the labeler, not at admission",
				"domains", len(t.entries)+len(t.pending), "bytes", t.bytes)
		}
		return
	}
	t.pending[domain] = shard
	t.bytes += size
	t.kickLocked()
}

func (t *shardTable) kickLocked() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// run loads the table, then writes the pending domains until ctx (the
// labeler's term) ends, one patch per flush interval at most. A failed read
// or write is tried again at the next interval: the table only saves label
// patches, so labeling never waits for it, and nothing is written to a
// table not read yet (it may be of another shard count).
func (t *shardTable) run(ctx context.Context) {
	for {
		err := t.load(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		t.log.Error(err, "Reading the shard table; trying again")
		select {
		case <-ctx.Done():
			return
		case <-time.After(shardTableFlushInterval):
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.wake:
		case <-t.recheckDue():
		}
		if err := t.flush(ctx); err != nil && ctx.Err() == nil {
			t.log.Error(err, "Writing the shard table; trying again")
			select {
			case t.wake <- struct{}{}:
			default:
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(shardTableFlushInterval):
		}
	}
}

// recheckDue fires when an asked-for recheck may run; nil when none is
// asked for.
func (t *shardTable) recheckDue() <-chan time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.recheck {
		return nil
	}
	return time.After(time.Until(t.lastChecked.Add(shardTableRecheckInterval)))
}

// flush writes the pending domains: a merge patch of them, or the whole
// table when it is gone. With a recheck due, it writes the table whole when
// it is gone, though nothing is pending; one asked for sooner stays asked.
func (t *shardTable) flush(ctx context.Context) error {
	t.mu.Lock()
	batch := make(map[string]string, len(t.pending))
	for d, n := range t.pending {
		batch[d] = strconv.Itoa(int(n))
	}
	recheck := t.recheck && time.Since(t.lastChecked) >= shardTableRecheckInterval
	if recheck {
		t.recheck = false
		t.lastChecked = time.Now()
	}
	t.mu.Unlock()
	shards := strconv.Itoa(int(t.env.opts.Shards))
	if recheck && len(batch) == 0 {
		var cm corev1.ConfigMap
		err := t.env.mgr.GetAPIReader().Get(ctx, types.NamespacedName{Namespace: t.env.opts.LeaseNamespace, Name: t.name}, &cm)
		switch {
		case apierrors.IsNotFound(err):
			t.log.Info("Shard table gone; writing it again")
			t.rv = ""
			return t.create(ctx, batch, shards)
		case err == nil && cm.ResourceVersion != t.rv:
			t.log.Info("Shard table changed since this labeler read it; reading it again")
			return t.load(ctx)
		}
		return err
	}
	if len(batch) == 0 {
		return nil
	}
	var err error
	if t.rv == "" {
		err = t.create(ctx, batch, shards)
	} else {
		err = t.patch(ctx, batch, shards)
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err) {
		// Changed, created or deleted since this term read it: read it
		// again, and write the batch at the next flush.
		if lerr := t.load(ctx); lerr != nil {
			return lerr
		}
		return fmt.Errorf("shard table %s/%s changed since it was read (%w); read again", t.env.opts.LeaseNamespace, t.name, err)
	}
	if err != nil {
		return fmt.Errorf("adding %d domains to shard table %s/%s: %w", len(batch), t.env.opts.LeaseNamespace, t.name, err)
	}
	t.mu.Lock()
	for d := range batch {
		t.entries[d] = t.pending[d]
		delete(t.pending, d)
	}
	t.env.metrics.tableDomains.Set(float64(len(t.entries)))
	t.mu.Unlock()
	t.log.V(1).Info("Added domains to the shard table", "added", len(batch))
	return nil
}

// patch adds batch to the table with a merge patch conditional on the
// resourceVersion last read or written.
func (t *shardTable) patch(ctx context.Context, batch map[string]string, shards string) error {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": t.rv, "annotations": map[string]string{t.env.keys.Shards: shards}},
		"data":     batch,
	})
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: t.env.opts.LeaseNamespace, Name: t.name}}
	if err := t.env.writer.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return err
	}
	t.rv = cm.ResourceVersion
	return nil
}

// create writes the table whole: every entry known, and batch.
func (t *shardTable) create(ctx context.Context, batch map[string]string, shards string) error {
	data := make(map[string]string, len(batch))
	t.mu.Lock()
	for d, n := range t.entries {
		data[d] = strconv.Itoa(int(n))
	}
	t.mu.Unlock()
	for d, v := range batch {
		data[d] = v
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: t.env.opts.LeaseNamespace, Name: t.name,
			Labels:      map[string]string{t.env.keys.Ring: t.env.opts.Ring},
			Annotations: map[string]string{t.env.keys.Shards: shards},
		},
		Data: data,
	}
	if err := t.env.writer.Create(ctx, cm); err != nil {
		return err
	}
	t.rv = cm.ResourceVersion
	return nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
