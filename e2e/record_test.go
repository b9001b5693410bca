package e2e

import (
	"bytes"
	"context"
	"io"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// recorder watches the ring's shard Leases and the replica pods for the
// whole run, and follows every replica container's log from its start to
// its exit, so the checks read what happened rather than sample it.
type recorder struct {
	s *suite

	mu sync.Mutex
	// leases is each shard Lease as last seen; history its versions.
	leases  map[int32]*coordinationv1.Lease
	history map[int32][]leaseVersion
	// pods are the replica pods seen, by UID; logs the output of each
	// kshard container seen running, by container ID.
	pods map[types.UID]*podRecord
	logs map[string]*processLog
}

// podRecord is one replica pod's life as the API server showed it.
type podRecord struct {
	Name string
	UID  types.UID
	// DeleteRequested is when its deletion was asked for; Gone when the
	// pod object disappeared (the kubelet confirmed the container ended).
	DeleteRequested, Gone time.Time
	Grace                 time.Duration
	// Exit is the kshard container's last terminated state seen.
	Exit *corev1.ContainerStateTerminated
	// ContainerID is the running kshard container's ID, "containerd://…".
	ContainerID string
}

// processLog is the output of one kshard container, one process: a
// container the kubelet restarts has a new ID and a log of its own.
type processLog struct {
	log   bytes.Buffer
	ended time.Time
}

func newRecorder(ctx context.Context, t *testing.T, s *suite) *recorder {
	t.Helper()
	r := &recorder{s: s, leases: map[int32]*coordinationv1.Lease{}, history: map[int32][]leaseVersion{}, pods: map[types.UID]*podRecord{}, logs: map[string]*processLog{}}
	leases := informers.NewSharedInformerFactoryWithOptions(s.cs, 0, informers.WithNamespace(systemNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = sharding.LabelRing + "=" + ringName + "," + sharding.LabelLeaseKind + "=" + lease.KindShard
		}))
	_, err := leases.Coordination().V1().Leases().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.lease(obj) },
		UpdateFunc: func(_, obj any) { r.lease(obj) },
	})
	if err != nil {
		t.Fatal(err)
	}
	pods := informers.NewSharedInformerFactoryWithOptions(s.cs, 0, informers.WithNamespace(systemNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = podSelector }))
	_, err = pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.pod(ctx, obj, false) },
		UpdateFunc: func(_, obj any) { r.pod(ctx, obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			r.pod(ctx, obj, true)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	leases.Start(ctx.Done())
	pods.Start(ctx.Done())
	leases.WaitForCacheSync(ctx.Done())
	pods.WaitForCacheSync(ctx.Done())
	return r
}

func (r *recorder) lease(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	n, ok := lease.ParseShardName(ringName, l.Name, shards)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases[n] = l
	v := leaseVersion{Holder: ptr.Deref(l.Spec.HolderIdentity, "")}
	if l.Spec.AcquireTime != nil {
		v.Acquired = l.Spec.AcquireTime.Time
	}
	hist := r.history[n]
	if last := len(hist) - 1; last < 0 || hist[last].Holder != v.Holder || !hist[last].Acquired.Equal(v.Acquired) {
		r.history[n] = append(hist, v)
	}
}

func (r *recorder) pod(ctx context.Context, obj any, deleted bool) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.pods[p.UID]
	if rec == nil {
		rec = &podRecord{Name: p.Name, UID: p.UID}
		r.pods[p.UID] = rec
	}
	if p.DeletionTimestamp != nil && rec.DeleteRequested.IsZero() {
		rec.Grace = time.Duration(ptr.Deref(p.DeletionGracePeriodSeconds, 0)) * time.Second
		rec.DeleteRequested = p.DeletionTimestamp.Add(-rec.Grace)
	}
	if deleted && rec.Gone.IsZero() {
		rec.Gone = time.Now()
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != "kshard" {
			continue
		}
		if cs.State.Terminated != nil {
			rec.Exit = cs.State.Terminated.DeepCopy()
		}
		if cs.State.Running != nil {
			rec.ContainerID = cs.ContainerID
		}
		if cs.State.Running != nil && r.logs[cs.ContainerID] == nil && !deleted {
			pl := &processLog{}
			r.logs[cs.ContainerID] = pl
			go r.follow(ctx, p.Name, pl)
		}
	}
}

// follow copies a pod's running kshard container's log until it exits.
func (r *recorder) follow(ctx context.Context, pod string, pl *processLog) {
	w := lockedWriter{mu: &r.mu, buf: &pl.log}
	stream, err := r.s.cs.CoreV1().Pods(systemNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: "kshard", Follow: true}).Stream(ctx)
	if err == nil {
		_, _ = io.Copy(w, stream)
		_ = stream.Close()
	}
	r.mu.Lock()
	pl.ended = time.Now()
	r.mu.Unlock()
}

// lockedWriter appends to a pod's log under the recorder's lock.
type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// holders returns each shard's live holder replica now (absent if none).
func (r *recorder) holders(now time.Time) map[int32]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int32]string{}
	for n, l := range r.leases {
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		if holder == "" || l.Spec.RenewTime == nil {
			continue
		}
		if now.Before(l.Spec.RenewTime.Add(time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second)) {
			out[n] = lease.HolderReplica(holder)
		}
	}
	return out
}

// lastRenew is when shard n's current holder last renewed it.
func (r *recorder) lastRenew(n int32) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l := r.leases[n]; l != nil && l.Spec.RenewTime != nil {
		return l.Spec.RenewTime.Time
	}
	return time.Time{}
}

// leaseVersion is a shard Lease's holder from an acquisition on, as written.
type leaseVersion struct {
	// Holder is the holder identity, "<replica>_<incarnation>"; "" for a
	// released Lease.
	Holder string
	// Acquired is the Lease's acquire time on the acquirer's clock; for a
	// release, when it was released.
	Acquired time.Time
}

// tenure is one holder's uninterrupted hold of a shard Lease.
type tenure struct {
	// Holder is the holder identity, "<replica>_<incarnation>".
	Holder string
	// From is its acquire time; To the next holder's, or the release's;
	// zero while it lasts.
	From, To time.Time
}

// tenuresOf turns a shard Lease's history into its holders' tenures. A
// holder acquiring again what it holds continues its tenure; a release ends
// it.
func tenuresOf(hist []leaseVersion) []tenure {
	var out []tenure
	for _, v := range hist {
		if n := len(out); n > 0 && out[n-1].To.IsZero() {
			if out[n-1].Holder == v.Holder {
				continue
			}
			out[n-1].To = v.Acquired
		}
		if v.Holder != "" {
			out = append(out, tenure{Holder: v.Holder, From: v.Acquired})
		}
	}
	return out
}

// tenures returns every shard's tenures so far: which replica held which
// shard when, for the handover steps (the write check reads the API
// server's audit log instead).
func (r *recorder) tenures() map[int32][]tenure {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int32][]tenure{}
	for n, hist := range r.history {
		out[n] = tenuresOf(hist)
	}
	return out
}

// shardsOf returns the shards replica holds now.
func (r *recorder) shardsOf(replica string) []int32 {
	var out []int32
	for n, h := range r.holders(time.Now()) {
		if h == replica {
			out = append(out, n)
		}
	}
	return out
}

// tenureAfter returns shard n's first tenure begun after t by a holder
// that is not a process of replica notBy ("": any holder), and whether
// there is one yet.
func (r *recorder) tenureAfter(n int32, t time.Time, notBy string) (tenure, bool) {
	for _, x := range r.tenures()[n] {
		if x.From.After(t) && (notBy == "" || lease.HolderReplica(x.Holder) != notBy) {
			return x, true
		}
	}
	return tenure{}, false
}

// handoverGap is how long one shard went from one holder to the next.
type handoverGap struct {
	Shard    int32
	From, To string
	// Released says the previous holder released the Lease; otherwise the
	// next one took it over after it expired.
	Released bool
	Gap      time.Duration
	At       time.Time
}

// handovers returns the shard handovers that ended at or after since: each
// acquisition after a release, or by another holder than the previous one,
// with the time the shard had no holder for a release.
func (r *recorder) handovers(since time.Time) []handoverGap {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []handoverGap
	for n, hist := range r.history {
		for i := 1; i < len(hist); i++ {
			v := hist[i]
			if v.Holder == "" || v.Acquired.Before(since) {
				continue
			}
			prev := hist[i-1]
			g := handoverGap{Shard: n, To: lease.HolderReplica(v.Holder), At: v.Acquired}
			switch {
			case prev.Holder == "":
				g.Released, g.Gap = true, v.Acquired.Sub(prev.Acquired)
				if i >= 2 {
					g.From = lease.HolderReplica(hist[i-2].Holder)
				}
			case prev.Holder != v.Holder:
				g.From = lease.HolderReplica(prev.Holder) // taken over: the gap is the crash step's to measure
			default:
				continue
			}
			out = append(out, g)
		}
	}
	return out
}

// auditLog merges the audit records of every process's log so far, and
// says how many processes there were.
func (r *recorder) auditLog() (*audit.Log, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := audit.NewLog()
	now := time.Now()
	for _, pl := range r.logs {
		ended := pl.ended
		if ended.IsZero() {
			ended = now
		}
		_ = d.Add(bytes.NewReader(pl.log.Bytes()), ended)
	}
	return d, len(r.logs)
}

// container returns the running kshard container of the named pod.
func (r *recorder) container(pod string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.pods {
		if p.Name == pod && p.Gone.IsZero() && p.DeleteRequested.IsZero() {
			return p.ContainerID
		}
	}
	return ""
}

// deleted returns the pods whose deletion was requested at or after since.
func (r *recorder) deleted(since time.Time) []podRecord {
	// A deletion timestamp has whole seconds.
	since = since.Truncate(time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []podRecord
	for _, p := range r.pods {
		if !p.DeleteRequested.IsZero() && !p.DeleteRequested.Before(since) {
			out = append(out, *p)
		}
	}
	return out
}
