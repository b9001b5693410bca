package sharding

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/kshard/kshard/sharding/lease"
	"github.com/kshard/kshard/sharding/ring"
)

// Defaults. Every held shard Lease is written once per RetryPeriod, so a ring
// costs about Shards/RetryPeriod Lease writes per second whatever its size:
// 64 shards at 5 s is 12.8 writes/s. A crashed replica's shards move after
// LeaseDuration; a fenced replica stops RenewDeadline after its last renewal,
// LeaseDuration−RenewDeadline before anyone else may start.
const (
	DefaultShards         int32 = 64
	DefaultLeaseDuration        = 15 * time.Second
	DefaultRenewDeadline        = 10 * time.Second
	DefaultRetryPeriod          = 5 * time.Second
	DefaultDrainTimeout         = 10 * time.Second
	DefaultBatchWindow          = time.Second
	DefaultLabelerWorkers       = 64
	DefaultStartupGrace         = 10 * time.Second
	DefaultWarmLeave            = 20 * time.Second
)

// Kind is an object kind that a shard watches.
type Kind struct {
	// Object is an instance of the kind, e.g. &corev1.ConfigMap{}.
	Object client.Object
	// Predicates filter its events before they become requests.
	Predicates []predicate.Predicate
	// Selector, when set, narrows the kind's informers beyond the shard
	// label, for example to the objects the controller marks as its own:
	// an object that merely copies a shard label never reaches the cache,
	// nor the replica's memory. For's Selector also narrows what the
	// labeler labels: an object it leaves out is never labeled.
	Selector labels.Selector
	// Transform, when set, runs on each object of the kind before the shard
	// caches store it, after managed fields are stripped: drop what the
	// reconciler never reads, as memory per object held. Objects read
	// through Replica.Reader are the transformed ones.
	Transform toolscache.TransformFunc
	// Requests, for an owned kind, maps an event to the primary objects it
	// concerns, instead of the controller owner reference: for objects many
	// primaries read, such as a per-domain mirror. oldObj is nil on create
	// and delete. It runs on the shard cache's event goroutine: read the
	// shard through reader (an index, not a list of everything) and do not
	// block.
	Requests func(ctx context.Context, reader client.Reader, oldObj, newObj client.Object) []types.NamespacedName
}

// Index is a field index added to every shard's cache, so a reconciler can
// find the objects of a shard by a computed value (for example, the external
// keys they read) without listing the shard.
type Index struct {
	Object  client.Object
	Field   string
	Extract client.IndexerFunc
}

// Options configure a Replica.
type Options struct {
	// Ring names the ring; replicas of one controller share it. Required, a
	// DNS label: it prefixes the ring's Lease names (<ring>-shard-<n>,
	// <ring>-member-<replica>), so several rings can share a namespace.
	Ring string
	// Identity is this replica's unique name in the ring, part of a Lease
	// name (a DNS subdomain). Defaults to $POD_NAME, else the hostname. A
	// second process started with an identity in use waits, not ready,
	// until the first stops renewing it.
	Identity string
	// Incarnation tells this process from any other started with the same
	// Identity: the Replica holds Leases as lease.Holder(Identity,
	// Incarnation). Defaults to lease.NewIncarnation(), drawn when the Replica is
	// created. Set it to name the process before the Replica exists: kshard
	// puts the holder identity in its requests' user agent, so that the API
	// server's audit log attributes every write to the one process that
	// made it. It may not contain "_".
	Incarnation string
	// LeaseNamespace holds the ring's Leases. Required.
	LeaseNamespace string
	// Shards is the fixed shard count of the ring. Defaults to 64.
	Shards int32
	// LabelPrefix prefixes the keys of the labels and annotations the ring
	// writes: <prefix>/shard and <prefix>/domain on its objects,
	// <prefix>/ring, <prefix>/lease-kind and <prefix>/shards on its Leases.
	// A DNS subdomain; default DefaultLabelPrefix (kshard.dev). Every
	// replica of a ring must use the same.
	LabelPrefix string
	// MetricsPrefix begins the names of the metrics the Replica exports on
	// controller-runtime's registry (<prefix>_shards_owned, ...): a metric
	// name's first part, [a-zA-Z_:][a-zA-Z0-9_:]*. Default
	// DefaultMetricsPrefix (kshard), which deploy/'s dashboard and alerts
	// query.
	MetricsPrefix string

	// LeaseDuration, RenewDeadline and RetryPeriod have the meaning they have
	// in client-go leader election, per shard Lease, member Lease and the
	// labeler Lease. LeaseDuration must be whole seconds (a Lease stores
	// seconds), RenewDeadline below it and above 1.2 × RetryPeriod
	// (lease.ValidateTiming). Default 15 s, 10 s and 5 s.
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// DrainTimeout bounds how long a release waits for in-flight reconciles;
	// then they are cancelled and waited for once more as long. A reconcile
	// still running after that keeps the Lease from being released: it is
	// left to expire, which the reconcile's writes cannot outlive (see
	// Replica.WriteContext). Defaults to 10 s.
	DrainTimeout time.Duration
	// LabelerWorkers is how many label patches the elected labeler sends at
	// once. A new object waits for its label before any replica sees it, so
	// the labeler paces a create storm: on 3,000 new objects, 4 replicas
	// wrote at 0.66 of the API server's write ceiling with 16 (create →
	// labeled p99 18 s), 0.74 with 32 (12 s) and 0.72 with 64 (11 s), and
	// 2 replicas at 0.71 with 64 (compare-sharding --fleets sharded:4,sharded:2
	// --objects 3000 --replica-args=--labeler-workers=N). A patch is a few
	// milliseconds of the API server's work; more workers wait on the server,
	// not on the labeler. Defaults to 64.
	LabelerWorkers int
	// ShardTable names a ConfigMap in LeaseNamespace that the elected
	// labeler keeps: every domain it labeled, with its shard. Given to a
	// MutatingAdmissionPolicy as params (deploy/base's kshard-shard-label),
	// it lets the API server stamp the shard label on the CREATE of an
	// object of a known domain, which then costs no label patch and no wait
	// for the labeler. The policy's expression must compute the domain as
	// Domain does. Past 1 MiB of domain names and shard numbers (what keeps
	// one ConfigMap below etcd's request limit), domains new to the table
	// are labeled by the labeler only. The labeler needs get, create,
	// update and patch on the ConfigMap. Empty, the default: no table.
	ShardTable string
	// BatchWindow is how long a cache waits for the next acquired shard
	// to join it (one LIST and one watch per kind for all of them) before it
	// starts: each join waits this long again, up to 10 windows from the
	// first, and the cache starts at once when every shard the ring gives
	// this replica is acquired. The API server scans the whole collection
	// for every LIST whatever its label selector, so a cache per shard
	// would cost a scan per shard; a fixed window split one replica's 64
	// acquisitions over 8 caches on a loaded machine. Defaults to 1 s: a
	// handover's releases arrive within a drain of each other.
	BatchWindow time.Duration

	// For is the primary kind: its objects carry the shard label and become
	// requests. Required.
	For Kind
	// Owns are kinds whose objects carry their owner's shard label and
	// enqueue their controller owner of the For kind.
	Owns []Kind
	// Domain returns a primary object's business domain. Required.
	Domain func(client.Object) string

	// Namespaces restricts the shard caches (and the labeler) to these
	// namespaces; empty watches all.
	Namespaces []string
	// Indexes are added to every shard's cache.
	Indexes []Index
	// SyncPeriod is the resync period of the shard caches (controller-runtime
	// jitters it by 10%). Zero keeps controller-runtime's default.
	SyncPeriod time.Duration

	// OnAcquire runs once per tenure, when a shard becomes active: before its
	// informers start and before its first reconcile, so per-shard state
	// (an external cache's store) exists when reconciles need it. ctx ends
	// when the tenure does, before OnRelease runs: work started for the
	// shard (warming a cache) stops with it. It must not block; to read the
	// shard's objects, wait in a goroutine with WaitForSync.
	OnAcquire func(ctx context.Context, shard int32)
	// OnRelease runs once per tenure whose OnAcquire ran, after it, when the
	// shard ends here on any path: a drain (after its reconciles finished,
	// before the Lease is released), fencing, a lost identity, shutdown.
	// Drop per-shard state here.
	OnRelease func(shard int32)

	// StatefulSet, when set, names the StatefulSet the replicas run in, so a
	// terminating replica can tell a restart (keep its ring position) from a
	// scale-down (leave), and a starting one knows its peers. Without it a
	// terminating replica always leaves.
	StatefulSet string
	// StartupGrace is how long a starting replica counts the StatefulSet's
	// desired replicas that have not joined yet as ring members: it claims
	// only its final share, and a shard whose owner is late stays unowned
	// for at most this long. Negative disables it. Defaults to 10 s, about
	// the time replicas of one StatefulSet take to start together.
	StartupGrace time.Duration
	// WarmLeave bounds how long Replica.Leave keeps running a leaving
	// replica's shards while the replicas that take them sync caches of
	// them; then it leaves anyway, and the shards it hands over start cold.
	// Negative: Leave returns at once. Defaults to 20 s: a cache's sync took
	// 9–13 s at 100,000 objects (docs/scale.md), and Leave, the drain and
	// the release fit deploy/base's terminationGracePeriodSeconds of 45.
	WarmLeave time.Duration

	// AuditLog, when set, receives a JSON line (AuditRecord) at the start
	// and end of every reconcile, for proving that reconciles never overlap.
	AuditLog io.Writer

	// Clock is the wall clock whose time this replica writes into Leases.
	// Nothing relies on it agreeing with other replicas' clocks: a Lease
	// expires lease duration after this replica saw its record change (on
	// its monotonic clock). Defaults to the system clock; tests skew it.
	Clock clock.PassiveClock

	// Logger defaults to the manager's logger.
	Logger logr.Logger
}

// defaultIdentity is id, else $POD_NAME, else the hostname.
func defaultIdentity(id string) (string, error) {
	if id == "" {
		id = os.Getenv("POD_NAME")
	}
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("defaulting identity from hostname: %w", err)
		}
		id = h
	}
	return id, nil
}

func (o *Options) setDefaults(log logr.Logger) error {
	id, err := defaultIdentity(o.Identity)
	if err != nil {
		return err
	}
	o.Identity = id
	if o.Incarnation == "" {
		o.Incarnation = lease.NewIncarnation()
	}
	if o.Shards == 0 {
		o.Shards = DefaultShards
	}
	if o.LabelPrefix == "" {
		o.LabelPrefix = DefaultLabelPrefix
	}
	if o.MetricsPrefix == "" {
		o.MetricsPrefix = DefaultMetricsPrefix
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.LabelerWorkers == 0 {
		o.LabelerWorkers = DefaultLabelerWorkers
	}
	if o.BatchWindow == 0 {
		o.BatchWindow = DefaultBatchWindow
	}
	if o.StartupGrace == 0 {
		o.StartupGrace = DefaultStartupGrace
	}
	if o.WarmLeave == 0 {
		o.WarmLeave = DefaultWarmLeave
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = log
	}
	return o.validate()
}

// optionsTimingNames name the durations as Options fields.
var optionsTimingNames = lease.TimingNames{LeaseDuration: "LeaseDuration", RenewDeadline: "RenewDeadline", RetryPeriod: "RetryPeriod"}

func (o *Options) validate() error {
	var errs []error
	if o.Ring == "" {
		errs = append(errs, errors.New("ring is required"))
	} else if msgs := validation.IsDNS1123Label(o.Ring); len(msgs) > 0 {
		// It prefixes the ring's Lease names.
		errs = append(errs, fmt.Errorf("ring %q: %s", o.Ring, strings.Join(msgs, "; ")))
	}
	if err := validateLabelPrefix(o.LabelPrefix); err != nil {
		errs = append(errs, err)
	}
	if !metricsPrefix.MatchString(o.MetricsPrefix) {
		errs = append(errs, fmt.Errorf("metrics prefix %q must match %s", o.MetricsPrefix, metricsPrefix))
	}
	if msgs := validation.IsDNS1123Subdomain(lease.MemberName(o.Ring, o.Identity)); len(msgs) > 0 {
		// It names the member Lease, and may not contain the "_" of holder
		// identities.
		errs = append(errs, fmt.Errorf("identity %q: %s", o.Identity, strings.Join(msgs, "; ")))
	}
	if strings.Contains(o.Incarnation, "_") {
		errs = append(errs, fmt.Errorf("incarnation %q: may not contain \"_\", which ends the identity in a holder identity", o.Incarnation))
	}
	if o.LeaseNamespace == "" {
		errs = append(errs, errors.New("lease namespace is required"))
	}
	if o.ShardTable != "" {
		if msgs := validation.IsDNS1123Subdomain(o.ShardTable); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("shard table %q: %s", o.ShardTable, strings.Join(msgs, "; ")))
		}
	}
	if o.Shards < 1 || o.Shards > ring.MaxShards {
		errs = append(errs, fmt.Errorf("shards must be in [1, %d], got %d", ring.MaxShards, o.Shards))
	}
	if o.For.Object == nil {
		errs = append(errs, errors.New("the primary kind (For) is required"))
	}
	if o.Domain == nil {
		errs = append(errs, errors.New("the Domain function is required"))
	}
	if err := lease.ValidateTiming(o.LeaseDuration, o.RenewDeadline, o.RetryPeriod, optionsTimingNames); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid sharding options: %w", errors.Join(errs...))
	}
	return nil
}
