package configbinding

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
)

// writeKind tells a binding's two writes apart.
type writeKind uint8

const (
	writeConfigMap writeKind = iota
	writeStatus
)

type writeKey struct {
	kind    writeKind
	binding types.NamespacedName
}

// unseenWrite is a write the informer has not shown back yet.
type unseenWrite struct {
	basedOn string // resourceVersion the cache showed when we wrote; "" for absent
	digest  string // what we wrote
	at      time.Time
}

// unseenFor is how long an entry is kept: an informer shows a write back
// within moments, so an older entry is one whose object was not reconciled
// again since (the common case after a create) and only costs memory.
const unseenFor = time.Minute

// unseenWrites remembers this replica's writes that its informers do not
// show yet. Our own ConfigMap apply requeues its binding at once (the
// ConfigMap's event), usually before the status patch that followed it is
// back in the cache: without this, that reconcile would see a stale status,
// patch it again and fail on resourceVersion, one wasted request per spec
// update. A cache that still shows the version a write was based on is
// behind, not changed by someone else: the write needs no repeat. An entry
// lives until the cache shows any other version of the object, the binding
// is gone, or unseenFor passed; so it holds writes in flight, not one per
// object.
type unseenWrites struct {
	mu        sync.Mutex
	m         map[writeKey]unseenWrite
	lastSweep time.Time
}

// wrote records a successful write of digest over the version basedOn, and
// sweeps out old entries at most once per unseenFor.
func (w *unseenWrites) wrote(k writeKey, basedOn, digest string) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[writeKey]unseenWrite{}
	}
	if now.Sub(w.lastSweep) > unseenFor {
		maps.DeleteFunc(w.m, func(_ writeKey, e unseenWrite) bool { return now.Sub(e.at) > unseenFor })
		w.lastSweep = now
	}
	w.m[k] = unseenWrite{basedOn: basedOn, digest: digest, at: now}
}

// pending returns the digest of our last write when the cache, at cachedRV,
// does not show it yet; once the cache moved on, the entry is forgotten.
func (w *unseenWrites) pending(k writeKey, cachedRV string) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.m[k]
	if !ok {
		return "", false
	}
	if e.basedOn != cachedRV {
		delete(w.m, k)
		return "", false
	}
	return e.digest, true
}

// forget drops a binding's entries (it was deleted).
func (w *unseenWrites) forget(binding types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, writeKey{writeConfigMap, binding})
	delete(w.m, writeKey{writeStatus, binding})
}

// statusDigest is what a status says, without timestamps: two statuses with
// the same digest need no write between them.
func statusDigest(st *configv1alpha1.ConfigBindingStatus) string {
	shard := int32(-1)
	if st.Shard != nil {
		shard = *st.Shard
	}
	s := fmt.Sprintf("%d/%d/%d", st.ObservedGeneration, shard, st.ResolvedRevision)
	for _, c := range st.Conditions {
		s += fmt.Sprintf("|%s/%s/%s/%d/%q", c.Type, c.Status, c.Reason, c.ObservedGeneration, c.Message)
	}
	return s
}

// configMapDigest is what the reconciler compares of a ConfigMap: its data,
// shard and domain labels, and controller owner.
func configMapDigest(data map[string]string, shard, domain string, owner types.UID) string {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(data)) {
		fmt.Fprintf(h, "%q=%q\n", k, data[k])
	}
	fmt.Fprintf(h, "shard=%s domain=%q owner=%s", shard, domain, owner)
	return hex.EncodeToString(h.Sum(nil))
}
