package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
)

func newControllerCommand() *cobra.Command {
	var (
		opts        replica.Options
		kubeconfig  string
		tokenFile   string
		auditPath   string
		shardingArg string
		memoryLimit string
		qps         float32
		burst       int
	)
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run one replica of the sharded ConfigBinding controller",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(kubeconfig)
			if err != nil {
				return err
			}
			if qps != 0 {
				cfg.QPS = qps
			}
			if burst > 0 {
				cfg.Burst = burst
			}
			switch shardingArg {
			case "on":
				opts.Sharding = true
			case "off":
			default:
				return fmt.Errorf("--sharding must be on or off, got %q", shardingArg)
			}
			if opts.Identity == "" {
				opts.Identity = os.Getenv("POD_NAME")
			}
			if opts.Identity == "" {
				if opts.Identity, err = os.Hostname(); err != nil {
					return fmt.Errorf("defaulting --replica-id: %w", err)
				}
			}
			if memoryLimit != "" {
				q, err := resource.ParseQuantity(memoryLimit)
				if err != nil || q.Value() <= 0 {
					return fmt.Errorf("--memory-limit %q: want a positive quantity such as 512Mi", memoryLimit)
				}
				opts.MemoryLimit = q.Value()
			}
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("reading --configcenter-token-file: %w", err)
				}
				opts.ConfigCenterToken = strings.TrimSpace(string(b))
			}
			switch auditPath {
			case "":
			case "-":
				// In a pod the container's log is where records survive
				// the pod: `kubectl logs` and the end-to-end suite read it.
				opts.AuditLog = os.Stdout
			default:
				f, err := os.OpenFile(auditPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
				if err != nil {
					return fmt.Errorf("opening --audit-log: %w", err)
				}
				defer f.Close()
				opts.AuditLog = io.Writer(f)
			}
			return replica.Run(cmd.Context(), cfg, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
	f.StringVar(&opts.Ring, "ring", "kshard", "ring name: replicas of one controller share it")
	f.Int32Var(&opts.Shards, "shards", sharding.DefaultShards, "fixed shard count of the ring; every replica must agree")
	f.StringVar(&opts.Identity, "replica-id", "", "this replica's name in the ring (default: $POD_NAME, else the hostname)")
	f.StringVar(&opts.LeaseNamespace, "lease-namespace", "kshard-system", "namespace of the ring's Leases (and of the StatefulSet)")
	f.StringVar(&opts.ShardTable, "shard-table", replica.DefaultShardTable, "ConfigMap in --lease-namespace where the elected labeler records each domain's shard, so that deploy/base's kshard-shard-label admission policy labels an object of a known domain at its CREATE (no label patch)")
	f.StringVar(&opts.StatefulSet, "statefulset", os.Getenv("STATEFULSET_NAME"), "StatefulSet the replicas run in, to tell a restart from a scale-down")
	f.DurationVar(&opts.LeaseDuration, "lease-duration", sharding.DefaultLeaseDuration, "how long a shard stays with a replica that stopped renewing")
	f.DurationVar(&opts.RenewDeadline, "renew-deadline", sharding.DefaultRenewDeadline, "a replica that cannot renew for this long stops the shard (fencing)")
	f.DurationVar(&opts.RetryPeriod, "retry-period", sharding.DefaultRetryPeriod, "Lease renewal period: the ring writes shards/retry-period Leases per second")
	f.Float32Var(&qps, "kube-api-qps", 0, "client-side limit of requests per second to the API server (default: the kubeconfig's, else none, -1 also none): the API server's priority and fairness is the limit that knows its load; a reconcile of a created object makes 2 writes and a replica's create storm ran at 396 writes/s, so a limit such as client-go's 5/s would hold it at a fiftieth (Lease renewals are never limited)")
	f.IntVar(&burst, "kube-api-burst", 0, "requests above --kube-api-qps allowed in a burst (default: the kubeconfig's)")
	f.StringVar(&opts.ConfigCenter, "config-center", replica.ConfigCenterEtcd, "the config center behind the cache: \"etcd\" (an etcd v3 key space, --etcd-*) or \"http\" (kshard's stand-in protocol, --configcenter-url)")
	f.StringVar(&opts.ConfigCenterURL, "configcenter-url", "http://127.0.0.1:8080", "with --config-center=http: base URL of the config center")
	f.StringVar(&tokenFile, "configcenter-token-file", "", "with --config-center=http: file holding a bearer token for the config center")
	f.StringSliceVar(&opts.Etcd.Servers, "etcd-servers", nil, "with --config-center=etcd: the etcd members' client URLs, comma-separated")
	f.StringVar(&opts.EtcdPrefix, "etcd-prefix", etcdsource.DefaultPrefix, "with --config-center=etcd: the key prefix under which a domain's keys are <prefix>/<domain>/<name>")
	f.BoolVar(&opts.EtcdWatchPerPoll, "etcd-watch-per-poll", false, "with --config-center=etcd: follow each domain with a watch per poll of its folder instead of one watch of the prefix shared by all (fewer bytes with many replicas and large values; more etcd watchers and a watch created per change)")
	f.StringVar(&opts.Authorization, "authorization", replica.AuthorizationNone, "who decides which namespace may read which domain: \"none\" (every namespace reads every domain) or \"spicedb\" (the SpiceDB at --spicedb-endpoint; docs/security.md)")
	f.StringVar(&opts.SpiceDB.Endpoint, "spicedb-endpoint", "", "with --authorization=spicedb: SpiceDB's gRPC address, host:port")
	f.StringVar(&opts.SpiceDB.TokenFile, "spicedb-token-file", "", "with --authorization=spicedb: file holding SpiceDB's preshared key or API token (never a flag, never logged)")
	f.StringVar(&opts.SpiceDB.CAFile, "spicedb-ca-file", "", "with --authorization=spicedb: CA file verifying SpiceDB's certificate; empty connects in plaintext (loopback, a sidecar)")
	f.BoolVar(&opts.AuthorizationFailOpen, "authorization-fail-open", false, "admit a ConfigBinding the authorization system has not decided on within 2s (a cold cache, SpiceDB unreachable); by default the admission pre-check refuses it (the reconciler never writes values before a decision allows them)")
	f.StringVar(&opts.Etcd.CAFile, "etcd-cafile", "", "with --config-center=etcd: CA file verifying the etcd servers' certificates")
	f.StringVar(&opts.Etcd.CertFile, "etcd-certfile", "", "with --config-center=etcd: client certificate file")
	f.StringVar(&opts.Etcd.KeyFile, "etcd-keyfile", "", "with --config-center=etcd: client key file")
	f.StringVar(&opts.Etcd.Username, "etcd-username", "", "with --config-center=etcd: user of etcd's authentication")
	f.StringVar(&opts.Etcd.PasswordFile, "etcd-password-file", "", "with --config-center=etcd: file holding the user's password (never a flag, never logged)")
	f.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", ":8080", "address of the metrics endpoint (\"0\" disables it)")
	f.BoolVar(&opts.MetricsSecure, "metrics-secure", false, "serve metrics over HTTPS with Kubernetes authentication and authorization")
	f.StringVar(&opts.MetricsCertDir, "metrics-cert-dir", "", "directory holding the secure metrics' tls.crt and tls.key, so Prometheus can verify them (default: a generated self-signed certificate)")
	f.StringVar(&memoryLimit, "memory-limit", os.Getenv("MEMORY_LIMIT"), "the container's memory limit (a quantity, e.g. 512Mi; default $MEMORY_LIMIT, which deploy/base sets from limits.memory): the Go soft limit becomes 90% of it unless GOMEMLIMIT is set, and the external cache a quarter")
	f.DurationVar(&opts.LeaseClockOffset, "lease-clock-offset", 0, "fault injection for chaos runs: shift the wall-clock times this replica writes into Leases, as on a node whose time sync failed (expiry is timed on each replica's monotonic clock, so nothing may change)")
	f.BoolVar(&opts.EnableHTTP2, "enable-http2", false, "serve the webhook and secure metrics over HTTP/2 too (off: HTTP/2's stream handling had denial-of-service flaws, CVE-2023-44487)")
	f.StringVar(&opts.HealthProbeBindAddress, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	f.StringVar(&opts.PprofBindAddress, "pprof-bind-address", "", "address of the pprof endpoint (empty disables it)")
	f.IntVar(&opts.MaxConcurrentReconciles, "max-concurrent-reconciles", 16, "reconcile workers, whatever the number of shards held: a reconcile waits on API round trips, not CPU, so workers set how much of the API server's write ceiling a replica can use; one replica's create storm of 3,000 objects reached 0.43 of it with 4 workers, 0.67 with 8, 0.77 with 16 and 0.66 with 32 (go run ./loadtest/cmd/loadtest --scenario compare-sharding --fleets off:1,sharded:4 --objects 3000 --replica-args=--max-concurrent-reconciles=N)")
	f.IntVar(&opts.LabelerWorkers, "labeler-workers", sharding.DefaultLabelerWorkers, "label patches the elected labeler sends at once: a created object waits for its label, so they pace a create storm; 4 replicas' storm of 3,000 objects wrote at 0.66 of the API server's write ceiling with 16, 0.74 with 32, 0.72 with 64 (and 2 replicas 0.71)")
	f.DurationVar(&opts.RequeueBaseDelay, "requeue-base-delay", 50*time.Millisecond, "first backoff of a failed reconcile (per object, doubling)")
	f.DurationVar(&opts.RequeueMaxDelay, "requeue-max-delay", 5*time.Minute, "longest backoff of a failed reconcile")
	f.DurationVar(&opts.SyncPeriod, "sync-period", 10*time.Hour, "resync period of the informers (jittered by 10%)")
	f.DurationVar(&opts.RetryAfter, "retry-after", time.Minute, "how often a binding that no event wakes looks again: a target ConfigMap someone else owns, a refused write, an unavailable config center (a notification requeues the others)")
	f.StringVar(&opts.ExternalMode, "external-mode", replica.ExternalCache, "cache: read through the off-heap cache; direct: call the config center in Reconcile (baseline)")
	f.StringVar(&opts.ExternalSource, "external-source", replica.SourceCache, "where values live with --external-mode=cache: cache (each replica's off-heap cache) or mirror (ExternalDomain objects written by the domain's shard holder)")
	f.DurationVar(&opts.Cache.HardTTL, "cache-ttl", time.Hour, "how long the external cache serves a value at all (fresh for 5m or half of this, then stale while it refreshes); a changed key whose value expired still requeues its objects")
	f.DurationVar(&opts.Cache.NegativeTTL, "cache-negative-ttl", 30*time.Second, "how long the external cache remembers that a key does not exist; a key created later heals its objects through the change feed")
	f.DurationVar(&opts.Cache.MaxRetryAfter, "cache-max-retry-after", time.Minute, "longest Retry-After of the config center the external cache and the ExternalDomain mirrors honour (the cache stops every call meanwhile; bindings waiting on it say ExternalUnavailable)")
	f.IntVar(&opts.Cache.MaxBatch, "cache-max-batch", 64, "keys of one domain the external cache reads from the config center in one call (etcd: one transaction of Gets), each call one of the 500 per second it makes at most; 1 reads every key alone")
	f.IntVar(&opts.Cache.MaxEntryBytes, "cache-max-entry-bytes", 64<<10, "largest value the external cache holds; a binding of a larger one says ValueTooLarge (it must fit in half of one of the cache's 16 internal shards)")
	f.Int64Var(&opts.MirrorMaxBytes, "mirror-max-bytes", 512<<10, "largest domain an ExternalDomain mirror holds; a larger one gets the TooLarge condition")
	f.IntVar(&opts.WebhookPort, "webhook-port", 0, "port of the ConfigBinding admission pre-check over HTTPS (0 disables it)")
	f.StringVar(&opts.WebhookHost, "webhook-host", "", "address the admission webhook listens on (default: all)")
	f.StringVar(&opts.WebhookCertDir, "webhook-cert-dir", "", "directory holding the webhook's tls.crt and tls.key (default: controller-runtime's temp dir)")
	f.StringVar(&shardingArg, "sharding", "on", "on: sharded ring; off: one active replica by leader election (baseline)")
	f.StringVar(&auditPath, "audit-log", "", "append JSON lines of reconcile start and end to this file (\"-\": standard output; the logs go to standard error)")
	return cmd
}
