package configbinding_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configcenter/standin"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/controlplane"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
)

var (
	cp *controlplane.ControlPlane
	// configCenter is the etcd the envs read, each under a prefix of its
	// own: never the API server's.
	configCenter *configetcd.Server
)

// TestMain shares one control plane. Tests that count the API server's
// requests (writes_test.go) or register a cluster-wide webhook
// (admission_test.go) run alone, first; the others, each with its own
// namespaces, ring, Lease namespace and config center, run in parallel
// after them.
func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapcore.InfoLevel)))
	os.Exit(runTests(m))
}

// runTests starts the config center the envs share, an etcd of its own,
// around the control plane's tests.
func runTests(m *testing.M) int {
	flag.Parse()
	if !testing.Short() {
		dir, err := os.MkdirTemp("", "kshard-config-center-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "config center: %v\n", err)
			return 1
		}
		defer os.RemoveAll(dir)
		configCenter, err = configetcd.Start(context.Background(), configetcd.Options{Dir: dir})
		if err != nil {
			fmt.Fprintf(os.Stderr, "config center: %v\n", err)
			return 1
		}
		defer configCenter.Close()
	}
	return controlplane.RunTests(m, &cp)
}

func newClient(t testing.TB) client.Client {
	t.Helper()
	controlplane.Require(t, cp)
	c, err := client.New(cp.Config, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newWatchClient(t testing.TB) client.WithWatch {
	t.Helper()
	c, err := client.NewWithWatch(cp.Config, client.Options{Scheme: replica.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newNamespace(t testing.TB, c client.Client, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// auditBuffer collects a replica's audit log in memory.
type auditBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (a *auditBuffer) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.buf.Write(p)
}

// starts counts reconcile starts of one object since the given time.
func (a *auditBuffer) starts(namespace, name string, since time.Time) int {
	return len(a.startTimes(namespace, name, since))
}

// lastEnd is the latest end record of one object's reconciles since the
// given time, and whether a reconcile of it is open after it.
func (a *auditBuffer) lastEnd(namespace, name string, since time.Time) (end sharding.AuditRecord, open bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(a.buf.Bytes()))
	for sc.Scan() {
		var rec sharding.AuditRecord
		if json.Unmarshal(sc.Bytes(), &rec) != nil || rec.Namespace != namespace || rec.Name != name || rec.Time.Before(since) {
			continue
		}
		switch rec.Event {
		case "start":
			open = true
		case "end":
			end, open = rec, false
		}
	}
	return end, open
}

// startTimes are the times of the reconcile starts of one object since the
// given time, in order.
func (a *auditBuffer) startTimes(namespace, name string, since time.Time) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ts []time.Time
	sc := bufio.NewScanner(bytes.NewReader(a.buf.Bytes()))
	for sc.Scan() {
		var rec sharding.AuditRecord
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Event == "start" && rec.Namespace == namespace && rec.Name == name && !rec.Time.Before(since) {
			ts = append(ts, rec.Time)
		}
	}
	return ts
}

// env is one test's world: a config center and a replica on the shared
// control plane, in a namespace of their own.
type env struct {
	c  client.Client
	ns string
	cc center
	// standin is the stand-in config center behind cc, for an env started
	// withStandin; nil otherwise.
	standin *standin.Server
	audit   *auditBuffer
	opts    replica.Options // of the first replica; more replicas join its ring
	// stopFirst stops the first replica gracefully.
	stopFirst func()
}

func startEnv(t *testing.T, name string, cache externalcache.Options) *env {
	return startEnvWith(t, name, withCache(cache))
}

// withCache sets an env's cache options.
func withCache(cache externalcache.Options) func(*replica.Options) {
	return func(o *replica.Options) { o.Cache = cache }
}

// envShards is the shard count of an env's ring. Every held shard Lease is
// renewed once per RetryPeriod, so the count sets the API server's load (and
// the package's CPU time) while tests wait; no test here depends on 64, the
// default. 16 still splits the domains of TestHandoverWritesNothing and
// TestMirrorMovesWithShard over both replicas (8 would not).
const envShards = 16

// startEnvWith starts an env whose replica options the caller adjusts, in
// order. Its
// config center is the package's etcd, under a prefix of the env's own,
// seeded with domain-0..3 × key-0..3; an adjust that sets
// replica.ConfigCenterHTTP gets a stand-in of its own instead (withStandin).
func startEnvWith(t *testing.T, name string, adjust ...func(*replica.Options)) *env {
	t.Helper()
	c := newClient(t)
	e := &env{c: c, ns: newNamespace(t, c, name), audit: &auditBuffer{}}
	leaseNS := newNamespace(t, c, name+"-leases")
	e.opts = replica.Options{
		Ring: name, Identity: name + "-0", LeaseNamespace: leaseNS, Shards: envShards,
		LeaseDuration: 6 * time.Second, RenewDeadline: 4 * time.Second, RetryPeriod: time.Second,
		MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		Sharding: true, AuditLog: e.audit, Namespaces: []string{e.ns},
	}
	for _, a := range adjust {
		a(&e.opts)
	}
	seed := configcenter.SeedOptions{Domains: 4, KeysPerDomain: 4, ValueBytes: 16}
	if e.opts.ConfigCenter == replica.ConfigCenterHTTP {
		ctx, cancel := context.WithCancel(context.Background())
		cc, err := standin.Start(ctx, standin.Options{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cancel()
			cc.Close()
		})
		e.standin, e.cc = cc, standinCenter{cc}
		e.opts.ConfigCenterURL = cc.URL()
	} else {
		e.cc = newEtcdCenter(t, etcdsource.DefaultPrefix+"/"+e.ns, seed)
		e.opts.Etcd.Servers = []string{configCenter.Endpoint()}
		e.opts.EtcdPrefix = etcdsource.DefaultPrefix + "/" + e.ns
	}
	e.stopFirst = e.startReplica(t, e.opts)
	return e
}

// withStandin gives an env the stand-in config center, for the faults only
// its protocol makes (standin.Server.SetFaults: latency, an outage answered
// 503 with a Retry-After, failing or short polls) and the requests it
// counts by route.
func withStandin(o *replica.Options) { o.ConfigCenter = replica.ConfigCenterHTTP }

// startReplica runs a replica until the test ends; the returned stop ends
// it earlier (gracefully: it drains and releases its shards).
func (e *env) startReplica(t *testing.T, opts replica.Options) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- replica.Run(ctx, cp.Config, opts) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("replica %s: %v", opts.Identity, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (e *env) create(t *testing.T, name, domain string, keys ...string) *configv1alpha1.ConfigBinding {
	t.Helper()
	cb := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec:       configv1alpha1.ConfigBindingSpec{Domain: domain, Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: name + "-config"}},
	}
	for _, k := range keys {
		cb.Spec.Keys = append(cb.Spec.Keys, configv1alpha1.ConfigKey(k))
	}
	if err := e.c.Create(context.Background(), cb); err != nil {
		t.Fatal(err)
	}
	return cb
}

// waitReason waits until the binding's Ready condition has the reason, for
// its current generation, and returns the binding.
func (e *env) waitReason(t *testing.T, name, reason string) *configv1alpha1.ConfigBinding {
	t.Helper()
	var cb configv1alpha1.ConfigBinding
	controlplane.Eventually(t, 2*time.Minute, name+" "+reason, func() error {
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &cb); err != nil {
			return err
		}
		c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady)
		if c == nil || c.Reason != reason || cb.Status.ObservedGeneration != cb.Generation {
			return fmt.Errorf("conditions %+v, generation %d observed %d", cb.Status.Conditions, cb.Generation, cb.Status.ObservedGeneration)
		}
		return nil
	})
	return &cb
}

func (e *env) configMap(t *testing.T, name string) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &cm); err != nil {
		t.Fatal(err)
	}
	return &cm
}

func (e *env) waitData(t *testing.T, cmName string, want map[string]string) {
	t.Helper()
	controlplane.Eventually(t, 2*time.Minute, cmName+" data", func() error {
		var cm corev1.ConfigMap
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: cmName}, &cm); err != nil {
			return err
		}
		for k, v := range want {
			if cm.Data[k] != v {
				return fmt.Errorf("data[%s] = %q, want %q", k, cm.Data[k], v)
			}
		}
		return nil
	})
}

// TestReadyWithData: a binding becomes Ready with the config center's values
// in its ConfigMap, owned by it, labeled with its shard; status names the
// shard.
func TestReadyWithData(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnv(t, "ready", externalcache.Options{})
	if _, err := e.cc.Put("domain-1", "key-0", "v-zero"); err != nil {
		t.Fatal(err)
	}
	e.create(t, "app", "domain-1", "key-0", "key-1")
	cb := e.waitReason(t, "app", configbinding.ReasonSynced)
	if ptr.Deref(cb.Status.Shard, -1) != sharding.ShardOf("domain-1", e.opts.Shards) {
		t.Fatalf("status shard %v", cb.Status.Shard)
	}
	if cb.Status.ResolvedRevision == 0 {
		t.Fatal("no resolved revision")
	}
	cm := e.configMap(t, "app-config")
	if cm.Data["key-0"] != "v-zero" || cm.Data["key-1"] == "" || len(cm.Data) != 2 {
		t.Fatalf("ConfigMap data %v", cm.Data)
	}
	if ref := metav1.GetControllerOf(cm); ref == nil || ref.UID != cb.UID {
		t.Fatalf("ConfigMap owner %v", cm.OwnerReferences)
	}
	if cm.Labels[sharding.LabelShard] != fmt.Sprint(*cb.Status.Shard) {
		t.Fatalf("ConfigMap labels %v", cm.Labels)
	}
}

// TestConfigCenterChangeReachesConfigMap: a PUT in the config center reaches
// the ConfigMap through the change feed, with no spec change and long TTLs.
func TestConfigCenterChangeReachesConfigMap(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnv(t, "feed", externalcache.Options{SoftTTL: time.Hour, HardTTL: 2 * time.Hour})
	e.create(t, "app", "domain-2", "key-1")
	before := e.waitReason(t, "app", configbinding.ReasonSynced)
	if _, err := e.cc.Put("domain-2", "key-1", "changed"); err != nil {
		t.Fatal(err)
	}
	e.waitData(t, "app-config", map[string]string{"key-1": "changed"})
	// The status patch follows the ConfigMap apply.
	controlplane.Eventually(t, time.Minute, "status names the new revision", func() error {
		after := e.waitReason(t, "app", configbinding.ReasonSynced)
		if after.Generation != before.Generation || after.Status.ResolvedRevision <= before.Status.ResolvedRevision {
			return fmt.Errorf("generation %d→%d, revision %d→%d", before.Generation, after.Generation, before.Status.ResolvedRevision, after.Status.ResolvedRevision)
		}
		return nil
	})
}

// TestMissingKeyNoHotLoop: a missing key is a KeyNotFound condition naming
// it, the object is not reconciled in a loop, and creating the key heals it.
func TestMissingKeyNoHotLoop(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnv(t, "missing", externalcache.Options{NegativeTTL: time.Hour})
	e.create(t, "app", "domain-0", "key-0", "no-such-key")
	cb := e.waitReason(t, "app", configbinding.ReasonKeyNotFound)
	if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); !strings.Contains(c.Message, "no-such-key") {
		t.Fatalf("message does not name the key: %q", c.Message)
	}
	// At rest, its reconciles end asking nothing more of the queue: the
	// key's creation arrives through the change feed. A hot loop ends
	// every one with a requeue or an error, and never comes to rest.
	controlplane.Eventually(t, time.Minute, "the KeyNotFound binding at rest", func() error {
		end, open := e.audit.lastEnd(e.ns, "app", time.Time{})
		switch {
		case open:
			return errors.New("a reconcile is running")
		case end.Outcome != "done":
			return fmt.Errorf("its last reconcile ended %q: a hot loop", end.Outcome)
		}
		return nil
	})
	if _, err := e.cc.Put("domain-0", "no-such-key", "now-here"); err != nil {
		t.Fatal(err)
	}
	e.waitReason(t, "app", configbinding.ReasonSynced)
	e.waitData(t, "app-config", map[string]string{"no-such-key": "now-here"})
}

// TestOutageKeepsDataAndRecovers: a binding that needs the config center
// during an outage (its spec gained a key) says ExternalUnavailable, its
// ConfigMap keeps the last values, and it recovers by itself afterwards.
func TestOutageKeepsDataAndRecovers(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnvWith(t, "outage", withStandin, withCache(externalcache.Options{
		SoftTTL: time.Second, TTLJitter: 0.01, HardTTL: time.Hour,
		Breaker: externalcache.BreakerOptions{ConsecutiveFailures: 2, Timeout: 2 * time.Second},
		Retry:   externalcache.RetryOptions{MaxAttempts: 2, BaseDelay: 50 * time.Millisecond, MaxElapsed: time.Second, FailureRetryInterval: time.Second},
	}))
	e.create(t, "app", "domain-3", "key-2")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	before := e.configMap(t, "app-config").Data
	if err := e.standin.SetFaults(configcenter.Faults{Outage: true}); err != nil {
		t.Fatal(err)
	}
	var cb configv1alpha1.ConfigBinding
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "app"}, &cb); err != nil {
		t.Fatal(err)
	}
	cb.Spec.Keys = append(cb.Spec.Keys, "key-3")
	if err := e.c.Update(context.Background(), &cb); err != nil {
		t.Fatal(err)
	}
	got := e.waitReason(t, "app", configbinding.ReasonExternalUnavailable)
	if c := meta.FindStatusCondition(got.Status.Conditions, configbinding.ConditionReady); !strings.Contains(c.Message, "key-3") {
		t.Fatalf("message does not name the key waiting for a value: %q", c.Message)
	}
	if data := e.configMap(t, "app-config").Data; len(data) != len(before) || data["key-2"] != before["key-2"] {
		t.Fatalf("ConfigMap changed during the outage: %v, was %v", data, before)
	}
	if err := e.standin.SetFaults(configcenter.Faults{}); err != nil {
		t.Fatal(err)
	}
	e.waitReason(t, "app", configbinding.ReasonSynced)
	e.waitData(t, "app-config", map[string]string{"key-2": before["key-2"]})
	if data := e.configMap(t, "app-config").Data; data["key-3"] == "" {
		t.Fatalf("key-3 missing after recovery: %v", data)
	}
}

// TestConfigMapRestored: deleting or editing the owned ConfigMap restores it.
func TestConfigMapRestored(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnv(t, "drift", externalcache.Options{})
	e.create(t, "app", "domain-0", "key-3")
	e.waitReason(t, "app", configbinding.ReasonSynced)
	want := e.configMap(t, "app-config").Data

	cm := e.configMap(t, "app-config")
	cm.Data = map[string]string{"key-3": "tampered", "extra": "x"}
	if err := e.c.Update(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	controlplane.Eventually(t, time.Minute, "edit reverted, the foreign key removed", func() error {
		// The other writer co-owns "extra": an apply alone cannot remove it.
		if got := e.configMap(t, "app-config").Data; !maps.Equal(got, want) {
			return fmt.Errorf("data %v, want %v", got, want)
		}
		return nil
	})

	if err := e.c.Delete(context.Background(), e.configMap(t, "app-config")); err != nil {
		t.Fatal(err)
	}
	e.waitData(t, "app-config", want)
}

// TestBaselines: the benchmark baselines (one active replica; synchronous
// config-center calls) reconcile the same way.
func TestBaselines(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	for _, tc := range []struct {
		name     string
		sharding bool
		mode     string
	}{{"single", false, replica.ExternalCache}, {"direct", true, replica.ExternalDirect}, {"single-direct", false, replica.ExternalDirect}} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEnvWith(t, tc.name, func(o *replica.Options) { o.Sharding, o.ExternalMode = tc.sharding, tc.mode })
			e.create(t, "app", "domain-1", "key-0", "key-1")
			cb := e.waitReason(t, "app", configbinding.ReasonSynced)
			if ptr.Deref(cb.Status.Shard, -1) != sharding.ShardOf("domain-1", e.opts.Shards) {
				t.Fatalf("status %+v", cb.Status)
			}
			if _, err := e.cc.Put("domain-1", "key-1", "new"); err != nil {
				t.Fatal(err)
			}
			if tc.mode == replica.ExternalCache {
				e.waitData(t, "app-config", map[string]string{"key-1": "new"})
			}
		})
	}
}

// TestTargetConflict: a ConfigMap of the target's name that someone else
// created is never taken over; the binding says why, and proceeds once the
// name is free.
func TestTargetConflict(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	e := startEnv(t, "conflict", externalcache.Options{})
	theirs := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "app-config"},
		Data:       map[string]string{"precious": "data"},
	}
	if err := e.c.Create(context.Background(), theirs); err != nil {
		t.Fatal(err)
	}
	e.create(t, "app", "domain-0", "key-0")
	cb := e.waitReason(t, "app", configbinding.ReasonTargetConflict)
	if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); !strings.Contains(c.Message, "app-config") {
		t.Fatalf("message does not name the ConfigMap: %q", c.Message)
	}
	if got := e.configMap(t, "app-config"); got.Data["precious"] != "data" || len(got.OwnerReferences) != 0 {
		t.Fatalf("someone else's ConfigMap was modified: %+v", got)
	}
	if err := e.c.Delete(context.Background(), theirs); err != nil {
		t.Fatal(err)
	}
	// Nothing requeues a conflict by itself: a spec change (or a resync)
	// looks again.
	if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(cb), cb); err != nil {
		t.Fatal(err)
	}
	cb.Spec.Keys = append(cb.Spec.Keys, "key-1")
	if err := e.c.Update(context.Background(), cb); err != nil {
		t.Fatal(err)
	}
	e.waitReason(t, "app", configbinding.ReasonSynced)
}

// TestTwoBindingsOneTarget: a second binding naming a ConfigMap the first
// one owns gets TargetConflict and leaves it alone (both force-applied it
// and took it from each other while both said Synced); it takes the name
// over once the first binding and its ConfigMap are gone.
func TestTwoBindingsOneTarget(t *testing.T) {
	t.Parallel() // own namespaces, ring, Lease namespace and config center
	// A conflict looks again every RetryAfter: 2 s here instead of the
	// minute of the flag's default, so the take-over below does not wait
	// for a minute, and the wait for a flip sees a look or two.
	e := startEnvWith(t, "twotargets", func(o *replica.Options) { o.RetryAfter = 2 * time.Second })
	first := e.create(t, "first", "domain-0", "key-0")
	e.waitReason(t, "first", configbinding.ReasonSynced)
	second := &configv1alpha1.ConfigBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "second"},
		Spec: configv1alpha1.ConfigBindingSpec{Domain: "domain-0", Keys: []configv1alpha1.ConfigKey{"key-1"},
			Target: configv1alpha1.ConfigBindingTarget{ConfigMapName: "first-config"}},
	}
	if err := e.c.Create(context.Background(), second); err != nil {
		t.Fatal(err)
	}
	cb := e.waitReason(t, "second", configbinding.ReasonTargetConflict)
	if c := meta.FindStatusCondition(cb.Status.Conditions, configbinding.ConditionReady); !strings.Contains(c.Message, "ConfigBinding first") {
		t.Errorf("the message does not name the owner: %q", c.Message)
	}
	// Two reconciles' worth of time for a flip to show (and a look of the
	// second binding's RetryAfter).
	time.Sleep(3 * time.Second)
	if cm := e.configMap(t, "first-config"); metav1.GetControllerOf(cm).UID != first.UID || cm.Data["key-1"] != "" {
		t.Fatalf("the first binding's ConfigMap was taken: owner %v, data %v", metav1.GetControllerOf(cm), cm.Data)
	}
	e.waitReason(t, "first", configbinding.ReasonSynced)

	// No garbage collector runs here: delete the ConfigMap as it would.
	if err := e.c.Delete(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(context.Background(), e.configMap(t, "first-config")); err != nil {
		t.Fatal(err)
	}
	// Within a RetryAfter of the conflict's last look.
	e.waitReason(t, "second", configbinding.ReasonSynced)
	if cm := e.configMap(t, "first-config"); metav1.GetControllerOf(cm).UID != second.UID {
		t.Fatalf("owner %v, want the second binding", metav1.GetControllerOf(cm))
	}
}
