// Package sandbox is the local kshard playground behind `make run`
// (`cmd/kshard-dev`): a real control plane on loopback with kshard's CRDs,
// an etcd of its own as the config center, a SpiceDB deciding which
// namespace reads which domain, sample ConfigBindings, and three controller
// replicas as child processes, with a live view and a scripted tour of
// handover (graceful leave, join, crash).
//
// It exists so a newcomer sees kshard work with one command and no cluster:
// shards spread over replicas, objects labeled (by the API server at CREATE
// once their domain is known, by the labeler before), reconciled from the
// external cache, and shards moving when a replica leaves, joins or dies,
// with the time each move took. The replicas are real `kshard
// controller` processes, so what the sandbox shows is what a StatefulSet would
// do, down to SIGTERM and SIGKILL.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/kshard/kshard/externalcache/etcdsource"
	"github.com/kshard/kshard/internal/childproc"
	"github.com/kshard/kshard/internal/configcenter"
	"github.com/kshard/kshard/internal/configetcd"
	"github.com/kshard/kshard/internal/controlplane"
)

// Where the sandbox puts things. They match the defaults of `kshard
// controller` and `kshard status`, so the commands it suggests work as typed.
const (
	// LeaseNamespace holds the ring's Leases.
	LeaseNamespace = "kshard-system"
	// Ring names the replicas' ring.
	Ring = "kshard"
	// Namespace holds the sample ConfigBindings and their ConfigMaps; SpiceDB
	// grants it every domain through team Team.
	Namespace = "demo"
	// Ungranted holds one binding of a domain it has no grant for: it says
	// Forbidden.
	Ungranted = "intruder"
	// Team is the SpiceDB team whose member Namespace is.
	Team = "demo"
)

// Lease timing of the replicas: shorter than the production defaults (15 s /
// 10 s / 5 s) so a crash is visible in seconds, at the cost of more Lease
// writes, which a sandbox can afford.
const (
	leaseDuration = 6 * time.Second
	renewDeadline = 4 * time.Second
	retryPeriod   = time.Second
)

// Options configure a sandbox run. The zero value is what `make run` does.
type Options struct {
	// Dir holds the sandbox's files: the kubeconfig and one log per replica.
	// Defaults to <repository>/bin/dev, else a temporary folder.
	Dir string
	// Duration is how long the sandbox keeps running after its script, so a
	// scripted run ends by itself. Zero runs until the context is cancelled
	// (Ctrl-C).
	Duration time.Duration

	// Replicas is the number of controller replicas. Defaults to 3, the
	// smallest ring where a leave and a crash both leave more than one
	// replica to take the shards. With one replica there is no handover to
	// show and the script only waits for readiness.
	Replicas int
	// Objects is the number of sample ConfigBindings. Defaults to 120: enough
	// to spread over several shards, few enough to reconcile in seconds.
	Objects int
	// Shards is the ring's shard count, the replicas' --shards. Defaults to
	// theirs, sharding.DefaultShards (64). Every held shard Lease is renewed
	// once per RetryPeriod, so a smaller ring keeps a busy machine quieter.
	Shards int
	// Domains is the number of business domains in the config center, and so
	// the number of shards that hold objects. Defaults to 12.
	Domains int
	// KeysPerDomain is the number of keys seeded in each domain. Defaults to
	// 8; each ConfigBinding binds 2 or 3 of its domain's keys, so bindings
	// share keys and the external cache has hits to show.
	KeysPerDomain int
	// StepTimeout bounds every wait of the script (readiness, each handover).
	// Defaults to 3 minutes: generous, because a busy two-core machine is slow
	// and a slow step is not a failure, a stuck one is.
	StepTimeout time.Duration
	// StopTimeout is how long a replica may take to hand its shards over after
	// SIGTERM before it is killed. Defaults to 30s.
	StopTimeout time.Duration
	// ViewInterval is how often the live view refreshes. Defaults to 2s.
	ViewInterval time.Duration

	// Out receives what a person reads. Defaults to os.Stdout. On a terminal
	// the live view is redrawn in place; elsewhere each view is a new table,
	// so a log stays readable.
	Out io.Writer
	// Executable is the kshard binary the replicas run (`<Executable>
	// controller ...`). Required: cmd/kshard-dev finds it beside itself;
	// tests build kshard and name it here.
	Executable string
	// OnReplicaStarted, when set, is called with the process id of every
	// replica process the sandbox starts, restarts included, so a caller (a
	// test) can check afterwards that none of them outlived the sandbox.
	OnReplicaStarted func(replica string, pid int)
}

func (o *Options) setDefaults() error {
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	if o.Objects == 0 {
		o.Objects = 120
	}
	if o.Domains == 0 {
		o.Domains = 12
	}
	if o.KeysPerDomain == 0 {
		o.KeysPerDomain = 8
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = 3 * time.Minute
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 30 * time.Second
	}
	if o.ViewInterval == 0 {
		o.ViewInterval = 2 * time.Second
	}
	switch {
	case o.Replicas < 1:
		return fmt.Errorf("replicas must be at least 1, not %d", o.Replicas)
	case o.Objects < 1:
		return fmt.Errorf("objects must be at least 1, not %d", o.Objects)
	case o.Domains < 1:
		return fmt.Errorf("domains must be at least 1, not %d", o.Domains)
	case o.Shards < 0:
		return fmt.Errorf("shards must not be negative, not %d", o.Shards)
	case o.KeysPerDomain < 1:
		return fmt.Errorf("keys per domain must be at least 1, not %d", o.KeysPerDomain)
	case o.Duration < 0:
		return fmt.Errorf("duration must not be negative, not %s", o.Duration)
	}
	if o.Executable == "" {
		return errors.New("the kshard binary the replicas run (Executable) is required")
	}
	if o.Dir == "" {
		if root, err := controlplane.RepoRoot(); err == nil {
			o.Dir = filepath.Join(root, "bin", "dev")
		} else {
			dir, err := os.MkdirTemp("", "kshard-dev-")
			if err != nil {
				return fmt.Errorf("creating sandbox folder: %w", err)
			}
			o.Dir = dir
		}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return fmt.Errorf("creating sandbox folder: %w", err)
	}
	return nil
}

// Run starts the sandbox, runs its script, keeps running until ctx is
// cancelled or Duration passes, and then stops everything it started: the
// replica processes, the config center and the control plane. A cancelled
// ctx (Ctrl-C) is a normal end and returns nil; a step that fails or times
// out, or a replica that dies on its own, returns an error after the same
// cleanup.
func Run(ctx context.Context, opts Options) error {
	if err := opts.setDefaults(); err != nil {
		return err
	}
	s := &sandbox{
		opts:  opts,
		log:   logr.FromContextOrDiscard(ctx).WithName("sandbox"),
		out:   newScreen(opts.Out),
		begin: time.Now(),
	}
	err := s.run(ctx)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// The person (or the caller) stopped us: not a failure.
		s.out.printf("interrupted: %v", err)
		return nil
	}
	return err
}

// sandbox is one run: what it started, so it can stop all of it.
type sandbox struct {
	opts  Options
	log   logr.Logger
	out   *screen
	begin time.Time

	kubeconfig string
	replicas   *supervisor
}

func (s *sandbox) run(parent context.Context) error {
	// runCtx also ends when a replica dies on its own or a background
	// goroutine panics, so every wait of the script fails fast with the cause.
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)

	s.kubeconfig = filepath.Join(s.opts.Dir, "kubeconfig")
	s.out.printf("starting the control plane (etcd + kube-apiserver) ...")
	start := time.Now()
	cp, err := controlplane.Start(controlplane.Options{KubeconfigPath: s.kubeconfig})
	if err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	defer func() {
		s.out.printf("stopping the control plane ...")
		if err := cp.Stop(); err != nil {
			s.log.Error(err, "Stopping the control plane")
			s.out.printf("stopping the control plane: %v", err)
		}
	}()
	s.out.printf("control plane ready in %s, ConfigBinding CRD installed; kubeconfig %s", since(start), shown(s.kubeconfig))
	if err := context.Cause(ctx); ctx.Err() != nil {
		return err
	}
	cfg := rest.CopyConfig(cp.Config)
	// The sandbox's own calls are few but bursty (creating the objects,
	// polling the ring during a handover); client-go's default of 5 QPS would
	// make the measurements measure the rate limiter.
	cfg.QPS, cfg.Burst = 200, 400

	// The config center outlives the replicas: they watch it until they
	// stop, so it stops after them (defers run in reverse).
	center, err := s.startConfigCenter(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err := center.Close(); err != nil {
			s.log.Error(err, "Stopping the config center")
		}
	}()

	authz, err := s.startAuthorization(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err := authz.Close(); err != nil {
			s.log.Error(err, "Stopping SpiceDB")
		}
	}()

	c, err := newClient(cfg)
	if err != nil {
		return err
	}
	start = time.Now()
	if err := createNamespaces(ctx, c, LeaseNamespace, Namespace, Ungranted); err != nil {
		return err
	}
	if err := installShardLabelPolicy(ctx, c); err != nil {
		return err
	}
	if err := createBindings(ctx, c, append(sampleBindings(s.opts), ungrantedBinding())); err != nil {
		return err
	}
	s.out.printf("created %d ConfigBindings in namespace %s over %d domains in %s (unlabeled: the labeler labels them and records their domains, so the API server labels later ones at create)",
		s.opts.Objects, Namespace, s.opts.Domains, since(start))

	s.replicas, err = newSupervisor(supervisorOptions{
		Executable:    s.opts.Executable,
		Dir:           s.opts.Dir,
		Kubeconfig:    s.kubeconfig,
		ConfigCenter:  center.Endpoint(),
		SpiceDB:       authz.server.ClientOptions().Endpoint,
		SpiceDBToken:  authz.server.ClientOptions().TokenFile,
		Replicas:      s.opts.Replicas,
		StopTimeout:   s.opts.StopTimeout,
		OnStarted:     s.opts.OnReplicaStarted,
		OnUnexpected:  func(err error) { cancel(err) },
		Log:           s.log.WithName("replicas"),
		LeaseDuration: leaseDuration,
		RenewDeadline: renewDeadline,
		RetryPeriod:   retryPeriod,
		Shards:        s.opts.Shards,
	})
	if err != nil {
		return err
	}
	// Every replica stops on every way out of here: return, error, panic.
	defer s.stopReplicas()
	for _, r := range s.replicas.all() {
		if err := s.replicas.start(r); err != nil {
			return err
		}
		s.out.printf("started %s (pid %d): metrics http://%s/metrics, log %s", r.id, r.pid(), r.metricsAddr, shown(r.logPath))
	}

	v := newViewer(s, c)
	stopView := childproc.GoSafe(ctx, cancel, "live view", v.run)
	defer stopView()

	if err := (&script{s: s, c: c, scraper: newScraper(), center: center, authz: authz}).run(ctx); err != nil {
		return err
	}

	s.out.printf("\nthe sandbox keeps running with the live view; try:\n"+
		"  export KUBECONFIG=%s; kubectl get configbindings -A -o wide\n"+
		"  go run ./cmd/kshard status --kubeconfig %s\n"+
		"  tail -f %s\n"+
		"  %s",
		shown(s.kubeconfig), shown(s.kubeconfig), shown(filepath.Join(s.opts.Dir, "kshard-*.log")),
		s.etcdctl(center, "put", etcdsource.DefaultPrefix+"/"+configcenter.SeedDomain(0)+"/"+configcenter.SeedKey(0), "hello"))
	var timeout <-chan time.Time
	if s.opts.Duration > 0 {
		s.out.printf("running for another %s (Ctrl-C stops earlier)", s.opts.Duration)
		t := time.NewTimer(s.opts.Duration)
		defer t.Stop()
		timeout = t.C
	} else {
		s.out.printf("running until Ctrl-C")
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timeout:
		s.out.printf("%s passed: stopping", s.opts.Duration)
		return nil
	}
}

// startConfigCenter starts the config center, an etcd of its own (never the
// API server's) on a fresh data directory, and seeds its domains.
func (s *sandbox) startConfigCenter(ctx context.Context) (*configetcd.Server, error) {
	dir := filepath.Join(s.opts.Dir, "config-center")
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("clearing the config center's folder: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the config center's folder: %w", err)
	}
	center, err := configetcd.Start(ctx, configetcd.Options{Dir: dir})
	if err != nil {
		return nil, err
	}
	ec, err := center.Client()
	if err == nil {
		_, err = configetcd.Seed(ctx, ec, etcdsource.DefaultPrefix, configcenter.SeedOptions{
			Domains: s.opts.Domains, KeysPerDomain: s.opts.KeysPerDomain, ValueBytes: 64})
		_ = ec.Close()
	}
	if err != nil {
		_ = center.Close()
		return nil, err
	}
	s.out.printf("config center: etcd at %s (its own, not the API server's), %d domains × %d keys under %s/",
		center.Endpoint(), s.opts.Domains, s.opts.KeysPerDomain, etcdsource.DefaultPrefix)
	return center, nil
}

// etcdctl is the etcdctl command line a person types to run args against
// the config center: the etcdctl make controlplane builds beside etcd.
func (s *sandbox) etcdctl(center *configetcd.Server, args ...string) string {
	bin := "etcdctl"
	if dir, err := controlplane.Assets(); err == nil {
		bin = shown(filepath.Join(dir, "etcdctl"))
	}
	return strings.Join(append([]string{bin, "--endpoints", center.Endpoint()}, args...), " ")
}

// stopReplicas hands every running replica's shards over and stops it
// (SIGTERM, then SIGKILL of its process group after StopTimeout).
func (s *sandbox) stopReplicas() {
	start := time.Now()
	running := s.replicas.running()
	if len(running) > 0 {
		s.out.printf("stopping %d replicas (SIGTERM, SIGKILL after %s) ...", len(running), s.opts.StopTimeout)
	}
	for _, res := range s.replicas.stopAll() {
		switch {
		case errors.Is(res.err, childproc.ErrGraceExpired):
			s.out.printf("  %v", res.err)
		case res.err != nil:
			s.out.printf("  %s: %s", res.id, childproc.ExitText(res.err))
		}
	}
	s.replicas.close()
	if len(running) > 0 {
		s.out.printf("replicas stopped in %s", since(start))
	}
}

// since is a duration rounded for people.
func since(t time.Time) time.Duration { return round(time.Since(t)) }

func round(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// shown is a path as the sandbox prints it for the user to paste: relative
// to the working directory (where make run was typed) when it lies under
// it, so that what it prints reads the same on every machine.
func shown(path string) string {
	wd, err := os.Getwd()
	if err != nil {
		return path
	}
	rel, err := filepath.Rel(wd, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return path
	}
	return rel
}
