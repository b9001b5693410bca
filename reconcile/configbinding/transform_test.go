package configbinding

import (
	"encoding/hex"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/sharding"
)

// TestCacheTransformKeepsDigest: a ConfigMap without its data (as the caches
// keep it) compares with a binding's wish exactly as the full one does, and
// a change of data, labels or owner changes the comparison.
func TestCacheTransformKeepsDigest(t *testing.T) {
	full := func() *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "n",
				Labels:          map[string]string{sharding.LabelShard: "3", sharding.LabelDomain: "d"},
				OwnerReferences: []metav1.OwnerReference{{UID: "u", Controller: ptr.To(true), Kind: "ConfigBinding", Name: "b"}}},
			Data: map[string]string{"k": "v", "k2": "v2"},
		}
	}
	want := configMapDigest(map[string]string{"k": "v", "k2": "v2"}, "3", "d", "u")
	obj, err := CacheTransform(full())
	if err != nil {
		t.Fatal(err)
	}
	cached := obj.(*corev1.ConfigMap)
	if cached.Data != nil || cachedDigest(cached) != want || cachedDigest(full()) != want {
		t.Fatalf("cached data %v, digest %q, full digest %q, want %q", cached.Data, cachedDigest(cached), cachedDigest(full()), want)
	}
	for name, change := range map[string]func(*corev1.ConfigMap){
		"value":  func(cm *corev1.ConfigMap) { cm.Data["k"] = "other" },
		"key":    func(cm *corev1.ConfigMap) { cm.Data["extra"] = "" },
		"shard":  func(cm *corev1.ConfigMap) { cm.Labels[sharding.LabelShard] = "4" },
		"domain": func(cm *corev1.ConfigMap) { cm.Labels[sharding.LabelDomain] = "e" },
		"owner":  func(cm *corev1.ConfigMap) { cm.OwnerReferences[0].UID = "v" },
	} {
		cm := full()
		change(cm)
		obj, err := CacheTransform(cm)
		if err != nil {
			t.Fatal(err)
		}
		if cachedDigest(obj.(*corev1.ConfigMap)) == want {
			t.Errorf("a changed %s leaves the digest unchanged", name)
		}
	}
}

// TestCacheTransformIdempotent: a transformed ConfigMap transformed again
// keeps its digest (client-go may pass a transform its own output), while an
// annotation someone wrote on the real object is not taken for ours.
func TestCacheTransformIdempotent(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{sharding.LabelShard: "1"}}, Data: map[string]string{"k": "v"}}
	want := cachedDigest(cm)
	once, _ := CacheTransform(cm)
	twice, _ := CacheTransform(once)
	if got := cachedDigest(twice.(*corev1.ConfigMap)); got != want {
		t.Fatalf("digest after two transforms %q, want %q", got, want)
	}
	forged := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{annotationCachedDigest: hex.EncodeToString(want[:])}}}
	if cachedDigest(forged) == want {
		t.Fatal("a ConfigMap without data but with a copied digest annotation compares as the full one")
	}
}

// TestCacheTransformCostIndependentOfContent: what others put in a ConfigMap
// (large data, annotations such as kubectl's last-applied configuration,
// labels) is not kept in the caches: a tenant who copies kshard's labels
// onto large ConfigMaps costs a replica a name, not their size.
func TestCacheTransformCostIndependentOfContent(t *testing.T) {
	big := string(make([]byte, 256<<10))
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "n",
			Labels: map[string]string{sharding.LabelShard: "3", sharding.LabelDomain: "d", LabelManagedBy: FieldManager,
				"tenant": "x"},
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": big}},
		Data:       map[string]string{"k": big},
		BinaryData: map[string][]byte{"b": []byte(big)},
	}
	obj, err := CacheTransform(cm)
	if err != nil {
		t.Fatal(err)
	}
	cached := obj.(*corev1.ConfigMap)
	kept := 0
	for k, v := range cached.Annotations {
		kept += len(k) + len(v)
	}
	for k, v := range cached.Labels {
		kept += len(k) + len(v)
	}
	if cached.Data != nil || cached.BinaryData != nil || kept > 256 {
		t.Fatalf("cached ConfigMap keeps data %d, binary data %d, %d bytes of labels and annotations (%v)",
			len(cached.Data), len(cached.BinaryData), kept, cached.Labels)
	}
	if _, ok := cached.Labels["tenant"]; ok {
		t.Fatal("a label kshard does not read is cached")
	}
	if cached.Labels[sharding.LabelShard] != "3" || cached.Labels[LabelManagedBy] != FieldManager {
		t.Fatalf("kshard's own labels lost: %v", cached.Labels)
	}
}
