package loadtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// The load tester drives replicas it did not start when Options.StatefulSet
// names a StatefulSet of `kshard controller` pods in the --kubeconfig
// cluster (deploy/ as installed, e2e/overlay on the node of `make cluster`):
// a fleet's size is the StatefulSet's replica count, a kill is a forced pod
// deletion, and each container is one process instance. The replicas' own
// outputs stand in for what a child process gives: the audit records come
// from each container's log (the replicas must run with --audit-log=-), the
// metrics from each pod's HTTPS endpoint with a ServiceAccount token, and
// the holder identity a process writes into Leases from its first log line
// that names it.

// podTarget is the StatefulSet a run drives, and every container of its
// pods seen since the run began.
type podTarget struct {
	namespace, name string
	// container and image are the kshard container's name and image in
	// the pod template; selector selects the StatefulSet's pods.
	container, image, selector string
	// ring is the replicas' --ring, read from the pod template;
	// serviceAccount the ServiceAccount the pods run as, whose user the
	// write check expects each replica write from.
	ring, serviceAccount string
	// metricsPort is the container port of the replicas' metrics.
	metricsPort int32
	// restoreReplicas is the StatefulSet's replica count before the run,
	// written back at its end.
	restoreReplicas int32
	cs              kubernetes.Interface
	// metrics reads the pods' /metrics with the token of the load tester's
	// ServiceAccount.
	// metricsToken is the token of ServiceAccount metricsReader, which the
	// run's Prometheus scrapes the replicas with.
	metricsToken string
	logDir       string
	// centerFaults are the config center's faults before the run, set
	// back at its end.
	centerFaults *configcenter.Faults
	// onStart tells the run about a container that started in the pod of
	// an ordinal.
	onStart func(ordinal int, c *container)

	mu sync.Mutex
	// byPod is each pod's running container, by pod UID.
	byPod map[types.UID]*container
	// byHolder is the container behind a holder identity, from its log.
	byHolder map[string]*container
	// all are the containers met, so an ended one is never taken in again
	// from a stale pod status.
	all []*container
	// changed is closed and replaced whenever a container starts or ends.
	changed chan struct{}
	// seen is the kshard container's status in every pod the watch showed,
	// by pod UID, as first and as last seen: the memory check reads its
	// restarts and OOM kills from them. Each fleet ends scaled to 0, so by
	// the end of the run the last sight of a pod is its deletion, which
	// carries its final status.
	seen map[types.UID]*podSeen
}

// podSeen is one pod's kshard container as the watch first and last
// showed it.
type podSeen struct {
	pod         string
	first, last corev1.ContainerStatus
}

// container is one kshard container of a pod: one process of the replica.
// It ends when the API server showed it gone and its log stream ended (the
// kubelet ends the stream when the process exits; after a forced deletion
// the pod object is gone before that).
type container struct {
	pod, id string
	// metricsURL is its pod's metrics endpoint.
	metricsURL string
	logPath    string
	started    time.Time

	// holder is the identity it writes into Leases, once its log named
	// it; only its log follower sets it.
	holder string

	mu             sync.Mutex
	gone, logEnded time.Time
	done           chan struct{}
	closeOnce      sync.Once
	endTimer       *time.Timer
	// onEnded is told when it ended.
	onEnded func()
}

// containerLogGrace bounds how long a container seen gone may keep its log
// stream open before it counts as ended anyway (a stream the kubelet never
// closed): a forced deletion leaves the process its SIGTERM grace, 2 s.
const containerLogGrace = time.Minute

func (c *container) Started() time.Time { return c.started }

func (c *container) Running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Wait returns when the container ended: the later of its disappearance
// from the API and the end of its log.
func (c *container) Wait() (time.Time, error) {
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.logEnded.After(c.gone) {
		return c.logEnded, nil
	}
	return c.gone, nil
}

// seenGone records that the API server no longer shows the container
// running.
func (c *container) seenGone(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.gone.IsZero() {
		return
	}
	c.gone = at
	if !c.logEnded.IsZero() {
		c.end()
		return
	}
	c.endTimer = time.AfterFunc(containerLogGrace, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.end()
	})
}

// logDone records the end of the container's log stream.
func (c *container) logDone(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.logEnded = at
	if !c.gone.IsZero() {
		c.end()
	}
}

// end closes done once. Caller holds c.mu.
func (c *container) end() {
	c.closeOnce.Do(func() {
		if c.endTimer != nil {
			c.endTimer.Stop()
		}
		close(c.done)
		if c.onEnded != nil {
			go c.onEnded()
		}
	})
}

// newPodTarget reads the StatefulSet "namespace/name", checks that its
// replicas can be driven (audit records on standard output), and fills the
// Lease timing the run's checks use from the pod template's flags.
func newPodTarget(ctx context.Context, cs kubernetes.Interface, ref, logDir string, o *Options) (*podTarget, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("--statefulset %q must be namespace/name", ref)
	}
	sts, err := cs.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading StatefulSet %s: %w", ref, err)
	}
	t := &podTarget{namespace: ns, name: name, cs: cs, logDir: logDir, restoreReplicas: ptr.Deref(sts.Spec.Replicas, 1),
		byPod: map[types.UID]*container{}, byHolder: map[string]*container{}, changed: make(chan struct{}), seen: map[types.UID]*podSeen{}}
	if err := t.readTemplate(sts, o); err != nil {
		return nil, fmt.Errorf("StatefulSet %s: %w", ref, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("the selector of StatefulSet %s: %w", ref, err)
	}
	t.selector = sel.String()
	return t, nil
}

// readTemplate finds the kshard container and reads its flags.
func (t *podTarget) readTemplate(sts *appsv1.StatefulSet, o *Options) error {
	cs := sts.Spec.Template.Spec.Containers
	i := slices.IndexFunc(cs, func(c corev1.Container) bool { return len(c.Args) > 0 && c.Args[0] == "controller" })
	if i < 0 {
		return errors.New("no container runs `kshard controller`")
	}
	c := cs[i]
	t.container, t.image = c.Name, c.Image
	t.serviceAccount = sts.Spec.Template.Spec.ServiceAccountName
	if t.serviceAccount == "" {
		t.serviceAccount = "default"
	}
	flags := map[string]string{}
	for j, a := range c.Args {
		k, v, hasValue := strings.Cut(a, "=")
		if !strings.HasPrefix(k, "--") {
			continue
		}
		if !hasValue && j+1 < len(c.Args) && !strings.HasPrefix(c.Args[j+1], "--") {
			v = c.Args[j+1]
		}
		flags[strings.TrimPrefix(k, "--")] = v
	}
	if flags["audit-log"] != "-" {
		return fmt.Errorf("container %s must write its audit records to standard output (--audit-log=-, as e2e/overlay adds to deploy/node): the checks read them from the container logs", c.Name)
	}
	t.ring = flags["ring"]
	if t.ring == "" {
		t.ring = "kshard" // kshard controller's default
	}
	for flag, p := range map[string]*time.Duration{"lease-duration": &o.LeaseDuration, "renew-deadline": &o.RenewDeadline, "retry-period": &o.RetryPeriod} {
		if v, ok := flags[flag]; ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("container %s: --%s %q: %w", c.Name, flag, v, err)
			}
			*p = d
		}
	}
	o.Shards = sharding.DefaultShards // kshard controller's default
	if v, ok := flags["shards"]; ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			return fmt.Errorf("container %s: --shards %q is not a shard count", c.Name, v)
		}
		o.Shards = int32(n)
	}
	port := "8443"
	if addr, ok := flags["metrics-bind-address"]; ok {
		_, port, _ = net.SplitHostPort(addr)
	}
	n, err := strconv.ParseInt(port, 10, 32)
	if err != nil {
		return fmt.Errorf("container %s: --metrics-bind-address %q: no port", c.Name, flags["metrics-bind-address"])
	}
	t.metricsPort = int32(n)
	if _, secure := flags["metrics-secure"]; !secure {
		return fmt.Errorf("container %s: the load tester reads metrics over HTTPS with a token (--metrics-secure, as deploy/base sets)", c.Name)
	}
	if lim := c.Resources.Limits.Memory(); lim != nil && !lim.IsZero() {
		o.MemoryLimit = lim.String()
	} else {
		o.MemoryLimit = "0"
	}
	return nil
}

// metricsReader is the load tester's ServiceAccount, bound to the
// ClusterRole deploy/base ships for whoever scrapes the replicas.
const (
	metricsReader     = "kshard-loadtest"
	metricsReaderRole = "kshard-metrics-reader"
)

// authorize creates the load tester's ServiceAccount in namespace ns, binds
// it to the metrics reader role, and keeps a token of it, with which the
// run's Prometheus scrapes the pods.
func (t *podTarget) authorize(ctx context.Context, ns string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: metricsReader}}
	if _, err := t.cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ServiceAccount %s/%s: %w", ns, metricsReader, err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: metricsReader},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: metricsReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: metricsReader}},
	}
	if _, err := t.cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding ClusterRole %s to the load tester: %w", metricsReaderRole, err)
	}
	tr, err := t.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, metricsReader, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(24 * 3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", ns, metricsReader, err)
	}
	t.metricsToken = tr.Status.Token
	return nil
}

// watch follows the StatefulSet's pods until ctx ends: every container
// that runs gets its log followed into the log folder.
func (t *podTarget) watch(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(t.cs, 0, informers.WithNamespace(t.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = t.selector }))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.pod(ctx, obj, false) },
		UpdateFunc: func(_, obj any) { t.pod(ctx, obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			t.pod(ctx, obj, true)
		},
	}); err != nil {
		return fmt.Errorf("watching the pods of StatefulSet %s/%s: %w", t.namespace, t.name, err)
	}
	f.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("the pod watch of StatefulSet %s/%s did not sync: %w", t.namespace, t.name, context.Cause(ctx))
	}
	return nil
}

// pod takes in a pod as the API server showed it.
func (t *podTarget) pod(ctx context.Context, obj any, deleted bool) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	var running *corev1.ContainerStatus
	for i, cs := range p.Status.ContainerStatuses {
		if cs.Name == t.container && cs.State.Running != nil && cs.ContainerID != "" {
			running = &p.Status.ContainerStatuses[i]
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != t.container {
			continue
		}
		if ps := t.seen[p.UID]; ps != nil {
			ps.last = cs
		} else {
			t.seen[p.UID] = &podSeen{pod: p.Name, first: cs, last: cs}
		}
	}
	cur := t.byPod[p.UID]
	if cur != nil && (deleted || running == nil || running.ContainerID != cur.id) {
		cur.seenGone(now)
		delete(t.byPod, p.UID)
		cur = nil
	}
	if deleted || running == nil || cur != nil || p.Status.PodIP == "" ||
		slices.ContainsFunc(t.all, func(c *container) bool { return c.id == running.ContainerID }) {
		return
	}
	c := &container{
		pod: p.Name, id: running.ContainerID, done: make(chan struct{}),
		metricsURL: "https://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(t.metricsPort))) + "/metrics",
		logPath:    filepath.Join(t.logDir, fmt.Sprintf("%s.%s.log", p.Name, shortID(running.ContainerID))),
		// Kubernetes keeps whole seconds: the truncated start is at or
		// before the process's, so a Lease it wrote is never dated
		// before it.
		started: running.State.Running.StartedAt.Time,
		onEnded: t.notify,
	}
	t.byPod[p.UID] = c
	t.all = append(t.all, c)
	if ordinal, err := strconv.Atoi(strings.TrimPrefix(p.Name, t.name+"-")); err == nil && t.onStart != nil {
		t.onStart(ordinal, c) // a pod of the StatefulSet's ordinals
	}
	go t.follow(ctx, c)
	t.notifyLocked()
}

// podRestart is a replica container that restarted, or was OOM-killed,
// during the run.
type podRestart struct {
	Pod string
	// Restarts counts the restarts since the run first saw the pod.
	Restarts int32
	// Reason is the last termination's: OOMKilled, Error, with its exit
	// code.
	Reason string
}

func (p podRestart) String() string {
	noun := "restarts"
	if p.Restarts == 1 {
		noun = "restart"
	}
	return fmt.Sprintf("pod %s: %d container %s (last termination: %s)", p.Pod, p.Restarts, noun, p.Reason)
}

// oomKilled is the reason the kubelet gives a container the kernel killed
// for exceeding its memory limit.
const oomKilled = "OOMKilled"

// restartOf decides from a pod's kshard container status, as the run first
// and last saw it, whether the container restarted or was OOM-killed since
// the run began (since): its restart count grew, or its current or last
// termination is an OOM kill that ended after since. An earlier OOM kill,
// from before the run, is not the run's.
func restartOf(pod string, first, last corev1.ContainerStatus, since time.Time) (podRestart, bool) {
	r := podRestart{Pod: pod, Restarts: max(last.RestartCount-first.RestartCount, 0), Reason: "none seen"}
	oom := false
	for _, term := range []*corev1.ContainerStateTerminated{last.LastTerminationState.Terminated, last.State.Terminated} {
		if term == nil {
			continue
		}
		r.Reason = fmt.Sprintf("%s, exit code %d", term.Reason, term.ExitCode)
		if term.Reason == oomKilled && !term.FinishedAt.Time.Before(since) {
			oom = true
		}
	}
	return r, r.Restarts > 0 || oom
}

// restarts lists the containers that restarted or were OOM-killed since
// the run began, and counts the pods seen.
func (t *podTarget) restarts(since time.Time) (pods int, out []podRestart) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ps := range t.seen {
		if r, ok := restartOf(ps.pod, ps.first, ps.last, since); ok {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b podRestart) int { return strings.Compare(a.Pod, b.Pod) })
	return len(t.seen), out
}

// shortID is a container ID without its runtime prefix, cut to 12.
func shortID(id string) string {
	_, id, _ = strings.Cut(id, "://")
	return id[:min(12, len(id))]
}

// holderPattern finds the holder identity a replica logs with every line of
// its ring (the JSON logs of `kshard controller`).
var holderPattern = regexp.MustCompile(`"holder":"([^"]+)"`)

// follow copies the container's log to its file until the container
// ends. A stream the API server breaks while the container runs (a restart
// of the API server, which proxies the kubelet's stream) is opened again
// from the last line's timestamp, and the lines already copied are
// skipped: the audit records the checks read must not stop at a fault of
// the control plane.
func (t *podTarget) follow(ctx context.Context, c *container) {
	defer func() { c.logDone(time.Now()) }()
	out, err := os.Create(c.logPath)
	if err != nil {
		return
	}
	defer out.Close()
	var last time.Time
	for attempt := 0; ; attempt++ {
		opts := &corev1.PodLogOptions{Container: t.container, Follow: true, Timestamps: true}
		if !last.IsZero() {
			// Whole seconds: the lines of last's second come again.
			opts.SinceTime = &metav1.Time{Time: last}
		}
		stream, err := t.cs.CoreV1().Pods(t.namespace).GetLogs(c.pod, opts).Stream(ctx)
		if err != nil {
			if attempt == 0 {
				fmt.Fprintf(out, "loadtest: following the log of %s: %v\n", c.pod, err)
			}
		} else {
			last = t.copyLog(c, stream, out, last)
			stream.Close()
		}
		if ctx.Err() != nil || !t.stillRuns(ctx, c) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// copyLog copies a timestamped log stream to out without the timestamps,
// skipping the lines at or before after, and returns the last line's
// timestamp.
func (t *podTarget) copyLog(c *container, stream io.Reader, out io.Writer, after time.Time) time.Time {
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		stamp, line, ok := bytes.Cut(sc.Bytes(), []byte(" "))
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, string(stamp))
		if err != nil || !at.After(after) {
			continue
		}
		after = at
		if c.holder == "" {
			if m := holderPattern.FindSubmatch(line); m != nil && lease.HolderReplica(string(m[1])) == c.pod {
				t.mu.Lock()
				c.holder = string(m[1])
				t.byHolder[c.holder] = c
				t.mu.Unlock()
			}
		}
		_, _ = out.Write(append(line, '\n'))
	}
	return after
}

// stillRuns says whether the container still runs as its pod's kshard
// container: not seen gone, and its pod's status still names it running.
func (t *podTarget) stillRuns(ctx context.Context, c *container) bool {
	c.mu.Lock()
	gone := !c.gone.IsZero()
	c.mu.Unlock()
	if gone {
		return false
	}
	p, err := t.cs.CoreV1().Pods(t.namespace).Get(ctx, c.pod, metav1.GetOptions{})
	if err != nil {
		// The API server away (the fault itself): try again.
		return !apierrors.IsNotFound(err)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == t.container {
			return cs.ContainerID == c.id && cs.State.Running != nil
		}
	}
	return false
}

// containerOf is the container behind a holder identity, if its log named
// it yet.
func (t *podTarget) containerOf(holder string) *container {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byHolder[holder]
}

func (t *podTarget) notify() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.notifyLocked()
}

// notifyLocked wakes the waits. Caller holds t.mu.
func (t *podTarget) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// waitFor waits until cond holds, re-checking whenever a container starts
// or ends, for at most timeout.
func (t *podTarget) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		t.mu.Lock()
		changed := t.changed
		t.mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-deadline.C:
			return fmt.Errorf("%s: not within %s", what, timeout)
		case <-changed:
		case <-time.After(time.Second):
		}
	}
}

// scale writes the StatefulSet's replica count through its scale
// subresource, as `kubectl scale` does.
func (t *podTarget) scale(ctx context.Context, n int) error {
	s, err := t.cs.AppsV1().StatefulSets(t.namespace).GetScale(ctx, t.name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the scale of StatefulSet %s/%s: %w", t.namespace, t.name, err)
	}
	if s.Spec.Replicas == int32(n) {
		return nil
	}
	s.Spec.Replicas = int32(n)
	if _, err := t.cs.AppsV1().StatefulSets(t.namespace).UpdateScale(ctx, t.name, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("scaling StatefulSet %s/%s to %d: %w", t.namespace, t.name, n, err)
	}
	return nil
}

// deletePod deletes a replica's pod, at once (grace 0, forced, as
// `kubectl delete pod --grace-period=0 --force`) or with its grace period.
func (t *podTarget) deletePod(ctx context.Context, pod string, force bool) error {
	opts := metav1.DeleteOptions{}
	if force {
		opts.GracePeriodSeconds = ptr.To(int64(0))
	}
	if err := t.cs.CoreV1().Pods(t.namespace).Delete(ctx, pod, opts); err != nil {
		return fmt.Errorf("deleting pod %s/%s: %w", t.namespace, pod, err)
	}
	return nil
}

// runningCount is the number of the pods' containers that have not ended.
func (t *podTarget) runningCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, c := range t.all {
		if c.Running() {
			n++
		}
	}
	return n
}

// connectCenter uses the cluster's config center: an etcd of
// deploy/config-etcd (the default), or kshard's stand-in of
// deploy/configcenter (--config-center http), both at their Service's
// cluster IP (the node of `make cluster` routes the Service range to the
// host). It seeds the run's data into it, as the load tester's own config
// center would start with.
func (t *podTarget) connectCenter(ctx context.Context, o Options, work string) (center, error) {
	if o.ConfigCenter == CenterHTTP {
		return t.connectHTTPCenter(ctx, o)
	}
	dir := filepath.Join(work, "config-etcd-client")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cl, err := configetcd.ConnectCluster(ctx, t.cs, t.namespace, dir)
	if err != nil {
		return nil, err
	}
	e := &clusterEtcdCenter{cluster: cl}
	if _, err := configetcd.Seed(ctx, cl.Client, etcdsource.DefaultPrefix,
		configcenter.SeedOptions{Domains: o.Domains, KeysPerDomain: o.KeysPerDomain, ValueBytes: o.ValueBytes}); err != nil {
		e.close()
		return nil, fmt.Errorf("the config center at %s (Service %s/%s): %w", cl.Endpoint, t.namespace, configetcd.ClusterService, err)
	}
	e.desc = fmt.Sprintf("the cluster's etcd (Service %s/%s at %s, TLS with the replicas' client certificate), with the cluster network's latency (none added): %d domains × %d keys of %d bytes under %s",
		t.namespace, configetcd.ClusterService, cl.Endpoint, o.Domains, o.KeysPerDomain, o.ValueBytes, etcdsource.DefaultPrefix)
	return e, nil
}

// clusterEtcdCenter is a cluster's etcd (deploy/config-etcd): seeded and
// changed through its client port, scraped on its metrics port; nothing
// injects faults into it.
type clusterEtcdCenter struct {
	cluster *configetcd.Cluster
	desc    string
}

func (e *clusterEtcdCenter) put(ctx context.Context, domain, key, value string) error {
	_, err := e.cluster.Client.Put(ctx, etcdsource.DefaultPrefix+"/"+domain+"/"+key, value)
	return err
}

// setOutage is refused by Options.validate before a run starts: the
// cluster's etcd keeps its data in an emptyDir, so stopping its pod would
// lose the data, not make an outage.
func (e *clusterEtcdCenter) setOutage(context.Context, bool) error {
	return errors.New("an outage of the cluster's etcd is not injected")
}

func (e *clusterEtcdCenter) outage() string { return "is not taken away (a cluster's etcd)" }

// args are empty: the pods have their own (deploy/node's ETCD_SERVERS and
// client certificate).
func (e *clusterEtcdCenter) args() []string { return nil }

func (e *clusterEtcdCenter) scrape() (string, promScrape) {
	return jobConfigEtcd, promScrape{addr: e.cluster.Metrics, scheme: "http"}
}

func (e *clusterEtcdCenter) String() string { return e.desc }
func (e *clusterEtcdCenter) close()         { _ = e.cluster.Client.Close() }

// connectHTTPCenter uses the cluster's stand-in, the Service
// "configcenter" of deploy/configcenter: it seeds the run's data and sets
// the run's faults through the admin API.
func (t *podTarget) connectHTTPCenter(ctx context.Context, o Options) (*httpCenter, error) {
	svc, err := t.cs.CoreV1().Services(t.namespace).Get(ctx, centerService, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("finding the stand-in config center (Service %s/%s, as deploy/configcenter installs it): %w", t.namespace, centerService, err)
	}
	if len(svc.Spec.Ports) == 0 || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, fmt.Errorf("Service %s/%s has no cluster IP and port", t.namespace, centerService)
	}
	h := &httpCenter{url: "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port))), faults: o.centerFaults()}
	if h.cc, err = configcenter.NewClient(configcenter.ClientOptions{BaseURL: h.url, Caller: loadtestCaller}); err != nil {
		return nil, err
	}
	saved, err := h.cc.Faults(ctx)
	if err != nil {
		return nil, fmt.Errorf("the config center at %s (Service %s/%s) must answer the load tester: %w", h.url, t.namespace, centerService, err)
	}
	t.centerFaults = &saved
	res, err := h.cc.Seed(ctx, configcenter.SeedOptions{Domains: o.Domains, KeysPerDomain: o.KeysPerDomain, ValueBytes: o.ValueBytes})
	if err != nil {
		return nil, err
	}
	if err := h.cc.SetFaults(ctx, h.faults); err != nil {
		return nil, err
	}
	if err := h.cc.ResetStats(ctx); err != nil {
		return nil, err
	}
	h.desc = fmt.Sprintf("the cluster's, kshard's stand-in (Service %s/%s at %s), seeded and given its faults through its admin API: %d keys (%d domains × %d keys of %d bytes), %s latency + up to %s jitter, %g error rate",
		t.namespace, centerService, h.url, res.Keys, o.Domains, o.KeysPerDomain, o.ValueBytes, o.Latency, o.Jitter, o.ErrorRate)
	return h, nil
}

// centerService is the config center's Service in deploy/configcenter.
const centerService = "configcenter"
