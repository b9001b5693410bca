// Package replica assembles one kshard controller replica from the
// libraries: the sharding runtime (or the single-replica baseline), the
// external cache (or the direct baseline) in front of the config center, and
// the ConfigBinding reconciler. `kshard controller` is this package plus
// flags; tests and the load tester run the same assembly.
package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/authzcache"
	"github.com/kshard/kshard/authzcache/spicedbsource"
	"github.com/kshard/kshard/externalcache"
	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/reconcile/configbinding"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/lease"
)

// External modes.
const (
	// ExternalCache reads values through the off-heap cache (the default).
	ExternalCache = "cache"
	// ExternalDirect calls the config center inside Reconcile: the baseline.
	ExternalDirect = "direct"
)

// External sources (with ExternalCache mode).
const (
	// SourceCache keeps values in each replica's off-heap cache.
	SourceCache = "cache"
	// SourceMirror keeps values in ExternalDomain objects that the domain's
	// shard holder writes from the change feed; reconciles read them from
	// the shard's informer cache.
	SourceMirror = "mirror"
)

// DefaultShardTable is the shard table deploy/base's kshard-shard-label
// admission policy reads.
const DefaultShardTable = "kshard-shard-table"

// Options configure a replica. The zero value of each field takes the
// default documented on its flag in cmd/kshard.
type Options struct {
	Ring           string
	Identity       string
	LeaseNamespace string
	Shards         int32
	// ShardTable names the ConfigMap the labeler keeps for deploy/base's
	// admission policy (sharding.Options.ShardTable).
	ShardTable    string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// StatefulSet names the StatefulSet the replicas run in (restart versus
	// scale-down decisions); empty outside one.
	StatefulSet string

	// ConfigCenter is the kind of config center behind the cache:
	// ConfigCenterEtcd (an etcd v3 key space, Etcd and EtcdPrefix), the
	// default, or ConfigCenterHTTP (kshard's stand-in protocol, at
	// ConfigCenterURL).
	ConfigCenter      string
	ConfigCenterURL   string
	ConfigCenterToken string
	Etcd              etcdsource.ClientOptions
	EtcdPrefix        string
	// EtcdWatchPerPoll follows each domain with a watch per poll instead
	// of one shared watch (etcdsource.Options.WatchPerPoll).
	EtcdWatchPerPoll bool

	// Authorization decides which namespace may read which domain:
	// AuthorizationNone (the default: every namespace reads every domain)
	// or AuthorizationSpiceDB, the SpiceDB at SpiceDB.
	Authorization string
	SpiceDB       spicedbsource.ClientOptions
	// AuthorizationFailOpen admits a binding the authorization system has
	// not decided on in time (a cold cache, SpiceDB unreachable); by
	// default the admission pre-check refuses it. The reconciler never
	// writes a binding's values before a decision allows it.
	AuthorizationFailOpen bool

	MetricsBindAddress     string
	HealthProbeBindAddress string
	PprofBindAddress       string
	// Namespaces restricts what the replica watches; empty watches all.
	Namespaces []string
	// MetricsSecure serves metrics over HTTPS with Kubernetes authentication
	// and authorization, as in a cluster.
	MetricsSecure bool
	// MetricsCertDir holds the secure metrics' tls.crt and tls.key (reloaded
	// when they change), so scrapers can verify the server; empty serves a
	// certificate controller-runtime generates, which nobody can verify.
	MetricsCertDir string
	// EnableHTTP2 serves the webhook and secure metrics over HTTP/2 too;
	// off by default (see tlsOpts).
	EnableHTTP2 bool

	// MaxConcurrentReconciles is the reconcile workers of the replica,
	// whatever the number of shards it holds. Default 16.
	MaxConcurrentReconciles int
	// LabelerWorkers is how many label patches the elected labeler sends
	// at once (sharding.Options.LabelerWorkers). Default 64.
	LabelerWorkers int
	// RequeueBaseDelay and RequeueMaxDelay bound the per-object exponential
	// backoff of failed reconciles. Defaults 50ms and 5 minutes.
	RequeueBaseDelay time.Duration
	RequeueMaxDelay  time.Duration
	SyncPeriod       time.Duration
	// RetryAfter is how often a binding that waits without an event to
	// wake it (a target conflict, a refused write, an unavailable config
	// center) looks again: configbinding.Reconciler.RetryAfter. Default
	// one minute.
	RetryAfter   time.Duration
	ExternalMode string
	// ExternalSource chooses where cached values live: SourceCache (the
	// default) or SourceMirror. It needs ExternalMode cache and sharding.
	ExternalSource string
	// MirrorMaxBytes bounds one ExternalDomain's keys (default 512 KiB).
	MirrorMaxBytes int64
	// WebhookPort serves the ConfigBinding admission pre-check over HTTPS
	// with the certificate in WebhookCertDir (tls.crt, tls.key); 0 disables
	// it.
	WebhookPort    int
	WebhookHost    string
	WebhookCertDir string
	// Sharding off runs the classic single active replica: the baseline.
	Sharding bool
	AuditLog io.Writer
	// Cache tunes the external cache (TTLs, breaker, retries); its Source,
	// Feed, MaxShards, Log, OnUpdate and OnFeedHealth are set by the replica.
	Cache externalcache.Options
	// MemoryLimit is the container's memory limit in bytes (the downward
	// API's limits.memory); 0 when unknown. When set, the Go runtime's soft
	// limit becomes 90% of it (unless GOMEMLIMIT is set), so the collector
	// works harder before the kernel's OOM killer does, and the external
	// cache gets a quarter of it (at least 64 MiB) unless Cache.MaxBytes
	// says otherwise.
	MemoryLimit int64
	// LeaseClockOffset shifts the wall clock this replica writes into
	// Leases: fault injection for chaos runs (a node whose time sync
	// failed). Lease expiry never reads it (sharding observes renewals on
	// its own monotonic clock), which is what the fault checks.
	LeaseClockOffset time.Duration
}

// offsetClock is the system clock off by a fixed amount.
type offsetClock struct{ by time.Duration }

func (c offsetClock) Now() time.Time                  { return time.Now().Add(c.by) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// minCacheBytes is the smallest external cache a memory limit sizes: 4 MiB
// in each of the store's 16 internal shards (externalcache's default), room
// for a binding's largest values (64 KiB each) to live together.
const minCacheBytes = 64 << 20

// applyMemoryLimit sets the Go runtime's soft memory limit and the external
// cache's budget from the container's memory limit.
func (o *Options) applyMemoryLimit(log logr.Logger) {
	if o.MemoryLimit <= 0 {
		return
	}
	soft := "GOMEMLIMIT"
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(o.MemoryLimit / 10 * 9)
		soft = strconv.FormatInt(o.MemoryLimit/10*9, 10)
	}
	if o.Cache.MaxBytes == 0 {
		o.Cache.MaxBytes = max(o.MemoryLimit/4, minCacheBytes)
	}
	log.Info("Sized from the memory limit", "memoryLimit", o.MemoryLimit, "goMemLimit", soft, "externalCacheBytes", o.Cache.MaxBytes)
}

// timingFlags name the Lease timing as cmd/kshard's flags set it.
var timingFlags = lease.TimingNames{LeaseDuration: "--lease-duration", RenewDeadline: "--renew-deadline", RetryPeriod: "--retry-period"}

func (o *Options) setDefaults() error {
	if o.Ring == "" {
		o.Ring = "kshard"
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = "kshard-system"
	}
	if o.Shards == 0 {
		o.Shards = sharding.DefaultShards
	}
	if o.ShardTable == "" {
		o.ShardTable = DefaultShardTable
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = sharding.DefaultLeaseDuration
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = sharding.DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = sharding.DefaultRetryPeriod
	}
	// Sharded or not (a manager's leader election), the same Lease timing:
	// refused here with the flags named, not when a Lease is first written.
	if err := lease.ValidateTiming(o.LeaseDuration, o.RenewDeadline, o.RetryPeriod, timingFlags); err != nil {
		return err
	}
	if o.MaxConcurrentReconciles == 0 {
		o.MaxConcurrentReconciles = 16
	}
	if o.RequeueBaseDelay == 0 {
		o.RequeueBaseDelay = 50 * time.Millisecond
	}
	if o.RequeueMaxDelay == 0 {
		o.RequeueMaxDelay = 5 * time.Minute
	}
	if o.SyncPeriod == 0 {
		o.SyncPeriod = 10 * time.Hour
	}
	if o.ExternalMode == "" {
		o.ExternalMode = ExternalCache
	}
	if o.ExternalMode != ExternalCache && o.ExternalMode != ExternalDirect {
		return fmt.Errorf("external mode must be %q or %q, got %q", ExternalCache, ExternalDirect, o.ExternalMode)
	}
	if o.ExternalSource == "" {
		o.ExternalSource = SourceCache
	}
	switch {
	case o.ExternalSource != SourceCache && o.ExternalSource != SourceMirror:
		return fmt.Errorf("external source must be %q or %q, got %q", SourceCache, SourceMirror, o.ExternalSource)
	case o.ExternalSource == SourceMirror && o.ExternalMode == ExternalDirect:
		return fmt.Errorf("external source %q reads no value in Reconcile; it cannot be combined with external mode %q", SourceMirror, ExternalDirect)
	case o.ExternalSource == SourceMirror && !o.Sharding:
		return fmt.Errorf("external source %q needs sharding: the mirror of a domain is written by its shard's holder", SourceMirror)
	case o.WebhookPort != 0 && (o.ExternalMode != ExternalCache || !o.Sharding):
		return errors.New("the admission webhook answers from the cache or the mirror of held shards: it needs external mode cache and sharding")
	}
	if o.ConfigCenter == "" {
		o.ConfigCenter = ConfigCenterEtcd
	}
	if o.Authorization == "" {
		o.Authorization = AuthorizationNone
	}
	switch {
	case o.Authorization != AuthorizationNone && o.Authorization != AuthorizationSpiceDB:
		return fmt.Errorf("authorization must be %q or %q, got %q", AuthorizationNone, AuthorizationSpiceDB, o.Authorization)
	case o.Authorization == AuthorizationSpiceDB && (o.SpiceDB.Endpoint == "" || o.SpiceDB.TokenFile == ""):
		return errors.New("authorization by SpiceDB needs its endpoint and a token file")
	}
	switch {
	case o.ConfigCenter != ConfigCenterHTTP && o.ConfigCenter != ConfigCenterEtcd:
		return fmt.Errorf("config center must be %q or %q, got %q", ConfigCenterEtcd, ConfigCenterHTTP, o.ConfigCenter)
	case o.ConfigCenter == ConfigCenterHTTP && o.ConfigCenterURL == "":
		return errors.New("the config center URL is required")
	case o.ConfigCenter == ConfigCenterEtcd && len(o.Etcd.Servers) == 0:
		return errors.New("the config center's etcd servers are required")
	}
	if o.Identity == "" {
		return errors.New("the replica identity is required")
	}
	return nil
}

// Scheme holds the kinds a replica reads and writes.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = configv1alpha1.AddToScheme(s)
	return s
}

// Run runs the replica until ctx is done; on the way out it drains its shards.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	if err := opts.setDefaults(); err != nil {
		return err
	}
	log := ctrl.Log.WithName("replica").WithValues("replica", opts.Identity)
	opts.applyMemoryLimit(log)
	// A sharded replica names its holder identity in every request's user
	// agent: the API server's audit log then attributes each write to this
	// process, incarnation included, which is what internal/audit checks
	// against the shard Leases.
	incarnation := lease.NewIncarnation()
	if opts.Sharding {
		cfg = rest.CopyConfig(cfg)
		base := cfg.UserAgent
		if base == "" {
			base = rest.DefaultKubernetesUserAgent()
		}
		cfg.UserAgent = audit.UserAgent(base, lease.Holder(opts.Identity, incarnation))
	}
	mgr, err := newManager(cfg, opts)
	if err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}

	center, closeCenter, err := newConfigCenter(opts)
	if err != nil {
		return err
	}
	defer closeCenter()
	rec := &configbinding.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Events: mgr.GetEventRecorder("kshard"),
		RetryAfter: opts.RetryAfter}
	src, err := newSource(opts, center, rec, log)
	if err != nil {
		return err
	}
	authz, closeAuthz, err := newAuthorization(opts, rec, log)
	if err != nil {
		return err
	}
	defer closeAuthz()
	if authz != nil {
		rec.Authorizer = authz
		if err := mgr.Add(authz); err != nil {
			return err
		}
	}
	leave, err := wire(mgr, opts, incarnation, rec, src, authz)
	if err != nil {
		return err
	}
	log.Info("Starting replica", "sharding", opts.Sharding, "externalMode", opts.ExternalMode, "externalSource", opts.ExternalSource, "shards", opts.Shards)
	// The manager runs until the replica has handed its shards over warm
	// (sharding.Replica.Leave): stopping it stops the workers at once.
	mgrCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	go func() {
		select {
		case <-ctx.Done():
			leave(mgrCtx)
			stop()
		case <-mgrCtx.Done():
		}
	}()
	return mgr.Start(mgrCtx)
}

// rateLimiter backs off failing objects one by one. Successful reconciles
// are not rate limited: load is bounded by the worker count, and the API
// server's priority and fairness protects it.
func rateLimiter(opts Options) workqueue.TypedRateLimiter[sharding.Request] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[sharding.Request](opts.RequeueBaseDelay, opts.RequeueMaxDelay)
}

func namespaces(ns []string) map[string]cache.Config {
	if len(ns) == 0 {
		return nil
	}
	out := map[string]cache.Config{}
	for _, n := range ns {
		out[n] = cache.Config{}
	}
	return out
}

// shardLabel is the shard a sharded replica's cache holds an object for:
// its shard label.
func shardLabel(o client.Object) (int32, bool) {
	n, err := strconv.ParseInt(o.GetLabels()[sharding.LabelShard], 10, 32)
	return int32(n), err == nil
}

func domainOf(o client.Object) string {
	if cb, ok := o.(*configv1alpha1.ConfigBinding); ok {
		return cb.Spec.Domain
	}
	return ""
}

// wire connects the reconciler, the external source and the webhook to the
// shards' runtime, one way whether sharding is on or off: the shards' caches
// (or, sharding off, the manager's) watch ConfigBindings, their ConfigMaps
// and the source's kinds, the source follows each shard's tenure, and one
// controller runs the held shards' requests. It returns what to do when
// the replica is told to stop, before its manager stops: a ring's warm
// leave.
func wire(mgr manager.Manager, opts Options, incarnation string, rec *configbinding.Reconciler, src externalSource, authz *authzcache.Cache) (func(context.Context), error) {
	// shardOf is the runtime's: a ring reads the shard label, a single
	// replica an object's domain (with sharding off nothing labels objects).
	var shardOf func(client.Object) (int32, bool)
	primary := sharding.Kind{Object: &configv1alpha1.ConfigBinding{}, Predicates: []predicate.Predicate{
		configbinding.BindingPredicate(), src.initialList(func(o client.Object) (int32, bool) { return shardOf(o) }),
	}}
	owns := append([]sharding.Kind{{Object: &corev1.ConfigMap{}, Predicates: []predicate.Predicate{configbinding.ConfigMapPredicate()},
		Selector: configbinding.OwnedConfigMaps(), Transform: configbinding.CacheTransform}}, src.owns()...)
	var shards sharding.Runtime
	if opts.Sharding {
		rep, err := sharding.New(mgr, sharding.Options{
			Ring:           opts.Ring,
			Identity:       opts.Identity,
			Incarnation:    incarnation,
			LeaseNamespace: opts.LeaseNamespace,
			Shards:         opts.Shards,
			ShardTable:     opts.ShardTable,
			LeaseDuration:  opts.LeaseDuration,
			RenewDeadline:  opts.RenewDeadline,
			RetryPeriod:    opts.RetryPeriod,
			For:            primary,
			Owns:           owns,
			Domain:         domainOf,
			Clock:          offsetClock{opts.LeaseClockOffset},
			Indexes:        configbinding.Indexes(),
			SyncPeriod:     opts.SyncPeriod,
			StatefulSet:    opts.StatefulSet,
			Namespaces:     opts.Namespaces,
			AuditLog:       opts.AuditLog,
			LabelerWorkers: opts.LabelerWorkers,
			OnAcquire:      src.acquired,
			OnRelease:      src.released,
		})
		if err != nil {
			return nil, err
		}
		shards, shardOf = rep, shardLabel
	} else {
		// The manager's cache applies the ConfigMaps' selector and
		// transform (newManager).
		single, err := sharding.NewSingle(mgr, sharding.SingleOptions{
			Shards:    opts.Shards,
			Identity:  opts.Identity,
			For:       primary,
			Owns:      owns,
			Domain:    domainOf,
			Indexes:   configbinding.Indexes(),
			OnAcquire: src.acquired,
			OnRelease: src.released,
		})
		if err != nil {
			return nil, err
		}
		shards, shardOf = single, func(o client.Object) (int32, bool) { return single.ShardOf(o), true }
	}
	if err := mgr.AddReadyzCheck("shards", func(*http.Request) error { return shards.Ready() }); err != nil {
		return nil, err
	}
	if err := src.bind(mgr, shards); err != nil {
		return nil, err
	}
	rec.Shards, rec.Values, rec.Domains = shards, src.values(), src.domains()
	if opts.WebhookPort != 0 {
		adm := &configbinding.Admission{Keys: src.knowledge(), AuthorizationFailOpen: opts.AuthorizationFailOpen}
		if authz != nil {
			adm.Authorization = authz
		}
		if err := registerWebhook(mgr, adm); err != nil {
			return nil, err
		}
	}
	if _, err := shards.NewController("configbinding", rec, controller.TypedOptions[sharding.Request]{
		MaxConcurrentReconciles: opts.MaxConcurrentReconciles,
		RateLimiter:             rateLimiter(opts),
	}); err != nil {
		return nil, err
	}
	return shards.Leave, nil
}
