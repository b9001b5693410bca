package configbinding

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/sharding"
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

// digest identifies what a write said (a SHA-256): compared, never shown.
type digest [sha256.Size]byte

// unseenWrite is a write the informer has not shown back yet.
type unseenWrite struct {
	basedOn string // resourceVersion the cache showed when we wrote; "" for absent
	digest  digest // what we wrote
	at      time.Time
}

// unseenFor is how long an entry is kept: an informer shows a write back
// within moments, so an older entry is one whose object was not reconciled
// again since (the common case after a create) and only costs memory. One
// dropped too early costs at most the write it would have saved.
const unseenFor = 10 * time.Second

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
func (w *unseenWrites) wrote(k writeKey, basedOn string, d digest) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[writeKey]unseenWrite{}
	}
	if now.Sub(w.lastSweep) > unseenFor {
		// Into a new map: a Go map keeps its buckets after deletes, so the
		// one a create storm grew would hold its peak size for good (2.9 MiB
		// after 5,000 creates, more than the entries in flight under load).
		kept := make(map[writeKey]unseenWrite, len(w.m)/4)
		for k, e := range w.m {
			if now.Sub(e.at) <= unseenFor {
				kept[k] = e
			}
		}
		w.m, w.lastSweep = kept, now
	}
	w.m[k] = unseenWrite{basedOn: basedOn, digest: d, at: now}
}

// pending returns the digest of our last write when the cache, at cachedRV,
// does not show it yet; once the cache moved on, the entry is forgotten.
func (w *unseenWrites) pending(k writeKey, cachedRV string) (digest, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.m[k]
	if !ok {
		return digest{}, false
	}
	if e.basedOn != cachedRV {
		delete(w.m, k)
		return digest{}, false
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
func statusDigest(st *configv1alpha1.ConfigBindingStatus) digest {
	h := sha256.New()
	fmt.Fprintf(h, "%d/%d/%d", st.ObservedGeneration, ptr.Deref(st.Shard, -1), st.ResolvedRevision)
	for _, c := range st.Conditions {
		fmt.Fprintf(h, "|%s/%s/%s/%d/%q", c.Type, c.Status, c.Reason, c.ObservedGeneration, c.Message)
	}
	return digest(h.Sum(nil))
}

// configMapDigest is what the reconciler compares of a ConfigMap: its data,
// shard and domain labels, and controller owner.
func configMapDigest(data map[string]string, shard, domain string, owner types.UID) digest {
	h := sha256.New()
	for _, k := range slices.Sorted(maps.Keys(data)) {
		fmt.Fprintf(h, "%q=%q\n", k, data[k])
	}
	fmt.Fprintf(h, "shard=%s domain=%q owner=%s", shard, domain, owner)
	return digest(h.Sum(nil))
}

// annotationCachedDigest holds, on the ConfigMaps in a replica's caches only,
// the configMapDigest of the ConfigMap as the API server has it; its data is
// dropped (CacheTransform). It is never written to the API server. Its value
// ends in cacheNonce, which no one outside this process can know: a
// ConfigMap that arrives with such an annotation was transformed here
// already (client-go may hand a transform its own output), one that merely
// carries the annotation name was not.
const annotationCachedDigest = "kshard.dev/cached-digest"

var cacheNonce = func() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("reading random bytes: %v", err))
	}
	return "/" + hex.EncodeToString(b)
}()

// CacheTransform keeps ConfigMaps in the informer caches without their
// data: the reconciler only compares a ConfigMap with what its binding
// wants, and a digest of the data, labels and owner does that in 64 bytes
// instead of a copy of every value. It keeps kshard's labels and no other
// label or annotation either, so what a ConfigMap costs in memory does not
// depend on what others put in it. Pass it as the ConfigMap kind's
// transform (sharding.Kind.Transform, or the manager cache's ByObject). It
// is idempotent, as client-go asks of transforms.
func CacheTransform(obj any) (any, error) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return obj, nil
	}
	if _, done := transformedDigest(cm); done {
		return cm, nil
	}
	digest := configMapDigest(cm.Data, cm.Labels[sharding.LabelShard], cm.Labels[sharding.LabelDomain], controllerUID(cm))
	kept := map[string]string{}
	for _, k := range []string{sharding.LabelShard, sharding.LabelDomain, LabelManagedBy} {
		if v, ok := cm.Labels[k]; ok {
			kept[k] = v
		}
	}
	cm.Labels = kept
	cm.Annotations = map[string]string{annotationCachedDigest: hex.EncodeToString(digest[:]) + cacheNonce}
	cm.Data, cm.BinaryData = nil, nil
	return cm, nil
}

// LabelManagedBy marks the ConfigMaps kshard writes, with the value
// FieldManager.
const LabelManagedBy = "app.kubernetes.io/managed-by"

// OwnedConfigMaps selects the ConfigMaps kshard writes: cache only these.
// A ConfigMap without the mark is read from the API server once, when a
// binding's target is missing from the cache, to tell absent from
// someone else's.
func OwnedConfigMaps() labels.Selector {
	return labels.SelectorFromSet(labels.Set{LabelManagedBy: FieldManager})
}

// transformedDigest returns the digest CacheTransform left on a ConfigMap.
func transformedDigest(cm *corev1.ConfigMap) (digest, bool) {
	var d digest
	v, ok := strings.CutSuffix(cm.Annotations[annotationCachedDigest], cacheNonce)
	if !ok {
		return d, false
	}
	if n, err := hex.Decode(d[:], []byte(v)); err != nil || n != len(d) {
		return d, false
	}
	return d, true
}

// cachedDigest is the configMapDigest of a ConfigMap read from a cache:
// the transform's, or computed when the cache keeps data.
func cachedDigest(cm *corev1.ConfigMap) digest {
	if d, ok := transformedDigest(cm); ok {
		return d
	}
	return configMapDigest(cm.Data, cm.Labels[sharding.LabelShard], cm.Labels[sharding.LabelDomain], controllerUID(cm))
}
