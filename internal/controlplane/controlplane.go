// Package controlplane starts a real Kubernetes control plane (etcd and
// kube-apiserver built from pinned upstream sources) on loopback, with
// kshard's CRDs installed.
//
// kshard's promises are about what a real API server does: admission,
// resourceVersion conflicts, Lease semantics, label-selected watches. A fake
// client cannot break any of them, so every integration test, the local
// sandbox (cmd/kshard-dev) and the load tester start their cluster here. The
// package is a thin layer over controller-runtime's envtest that adds the
// repository's conventions: binaries from bin/k8s (or KUBEBUILDER_ASSETS), the
// CRDs from deploy/crd, and an optional kubeconfig file for kubectl. Setting
// USE_EXISTING_CLUSTER=true uses the cluster of the current kubeconfig instead.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kshard/kshard/internal/audit"
	"github.com/kshard/kshard/internal/promtext"
)

// AssetsEnv is the environment variable that points at a folder holding
// etcd and kube-apiserver. It takes precedence over the repository's bin/k8s,
// as it does for every envtest user.
const AssetsEnv = "KUBEBUILDER_ASSETS"

// Options configure a control plane. The zero value starts a fresh one from
// the repository's binaries with the repository's CRDs.
type Options struct {
	// AssetsDir holds the etcd and kube-apiserver binaries.
	// Defaults to $KUBEBUILDER_ASSETS, else <repository>/bin/k8s.
	AssetsDir string

	// CRDDirs are folders of CRD manifests to install and wait for.
	// Defaults to <repository>/deploy/crd.
	CRDDirs []string

	// KubeconfigPath, when set, receives an admin kubeconfig for the cluster,
	// for kubectl and for child processes.
	KubeconfigPath string

	// APIServerArgs are extra kube-apiserver flags, each replacing the
	// default of the same name.
	APIServerArgs map[string][]string

	// AuditLogPath, when set, receives the API server's own audit log
	// (JSON lines) of every write to Leases, ConfigMaps, ConfigBindings and
	// ExternalDomains, under internal/audit's Policy: the evidence that
	// internal/audit checks the replicas' writes against.
	AuditLogPath string

	// RestartLogPath, when set, receives the output (klog) of every
	// kube-apiserver RestartAPIServer starts, appended: what the server
	// did while its clients relisted.
	RestartLogPath string

	// UseExistingCluster talks to the cluster of the current kubeconfig instead
	// of starting one. Defaults to USE_EXISTING_CLUSTER=true in the environment.
	UseExistingCluster *bool

	// StartTimeout bounds the start of each component. Defaults to 2 minutes:
	// the first start on a busy two-core machine is slow, and a slow start is
	// not a failure.
	StartTimeout time.Duration

	// AttachOutput streams the control plane's own logs to stdout and stderr.
	AttachOutput bool

	// GOGC is the GOGC of the etcd and kube-apiserver Start runs, unless
	// the environment sets one. Defaults to 400, the tests': their rings
	// renew Leases steadily, and at Go's default (100) a tenth of the API
	// server's CPU time went to garbage collection, 4 % at 400. A
	// measurement of the API server's memory wants "100", what a cluster's
	// API server runs with: at 400 its heap grows to five times what is
	// live before a collection, not twice (docs/scale.md).
	GOGC string
}

func (o *Options) setDefaults() error {
	if o.AssetsDir == "" || len(o.CRDDirs) == 0 {
		root, err := RepoRoot()
		if err != nil {
			return err
		}
		if o.AssetsDir == "" {
			o.AssetsDir = assets(root)
		}
		if len(o.CRDDirs) == 0 {
			o.CRDDirs = []string{filepath.Join(root, "deploy", "crd")}
		}
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 2 * time.Minute
	}
	if o.GOGC == "" {
		o.GOGC = "400"
	}
	return nil
}

// ControlPlane is a running cluster. Stop it when done: its processes
// outlive the caller otherwise.
type ControlPlane struct {
	// Config is an admin client configuration (system:masters).
	Config *rest.Config
	// Kubeconfig is the admin kubeconfig file, when Options.KubeconfigPath
	// was set.
	Kubeconfig string

	env *envtest.Environment
	// apiServer is the kube-apiserver RestartAPIServer started, closing
	// apiServerDone when it exits; nil while envtest's own runs.
	apiServer     *exec.Cmd
	apiServerDone chan struct{}
	// restartLog is Options.RestartLogPath.
	restartLog string
}

// Start starts etcd and kube-apiserver on loopback ports, installs the CRDs
// and waits until they are served.
func Start(opts Options) (*ControlPlane, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory:    opts.AssetsDir,
		CRDDirectoryPaths:        opts.CRDDirs,
		ErrorIfCRDPathMissing:    true,
		UseExistingCluster:       opts.UseExistingCluster,
		ControlPlaneStartTimeout: opts.StartTimeout,
		ControlPlaneStopTimeout:  time.Minute,
		AttachControlPlaneOutput: opts.AttachOutput,
	}
	if !existing(opts.UseExistingCluster) {
		if err := checkAssets(opts.AssetsDir); err != nil {
			return nil, err
		}
		args := env.ControlPlane.GetAPIServer().Configure()
		if opts.AuditLogPath != "" {
			policy := opts.AuditLogPath + ".policy.yaml"
			if err := os.WriteFile(policy, audit.Policy, 0o600); err != nil {
				return nil, fmt.Errorf("writing the audit policy: %w", err)
			}
			// blocking: each event is written before its response is
			// sent, so a write a client saw answered is in the log.
			args.Set("audit-policy-file", policy)
			args.Set("audit-log-path", opts.AuditLogPath)
			args.Set("audit-log-format", "json")
			args.Set("audit-log-mode", "blocking")
			// Not rotated at the default 100 MB: a long load test
			// writes more, and a check must read the whole run
			// (audit.ReadAPILogFile reads rotated files too).
			args.Set("audit-log-maxsize", "100000")
		}
		for name, values := range opts.APIServerArgs {
			args.Set(name, values...)
		}
	}
	restoreEnv := setControlPlaneGOGC(opts.GOGC)
	cfg, err := env.Start()
	restoreEnv()
	if err != nil {
		// A half-started plane leaves processes behind; stop what did start.
		_ = env.Stop()
		return nil, fmt.Errorf("starting control plane from %s: %w", opts.AssetsDir, err)
	}
	cp := &ControlPlane{Config: cfg, env: env, restartLog: opts.RestartLogPath}
	if opts.KubeconfigPath != "" {
		if err := os.WriteFile(opts.KubeconfigPath, env.KubeConfig, 0o600); err != nil {
			_ = env.Stop()
			return nil, fmt.Errorf("writing kubeconfig %s: %w", opts.KubeconfigPath, err)
		}
		cp.Kubeconfig = opts.KubeconfigPath
	}
	return cp, nil
}

// EtcdURL is the API server's etcd's client URL, which serves its /metrics:
// what a load test reads of the store behind the API server.
func (c *ControlPlane) EtcdURL() string {
	if c.env.ControlPlane.Etcd == nil || c.env.ControlPlane.Etcd.URL == nil {
		return ""
	}
	return c.env.ControlPlane.Etcd.URL.String()
}

// KubeconfigBytes is the admin kubeconfig, for callers that write it
// somewhere of their own.
func (c *ControlPlane) KubeconfigBytes() []byte { return c.env.KubeConfig }

// Metrics reads the API server's own /metrics, by family: what tests count
// costs with (requests by verb and resource, objects scanned), as the server
// counted them rather than as a client thinks it sent them.
func (c *ControlPlane) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	defer body.Close()
	fams, err := promtext.Parse(body)
	if err != nil {
		return nil, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	return fams, nil
}

// Stop stops kube-apiserver and etcd and removes their data.
func (c *ControlPlane) Stop() error {
	if c == nil || c.env == nil {
		return nil
	}
	if c.Kubeconfig != "" {
		_ = os.Remove(c.Kubeconfig)
	}
	if c.apiServer != nil {
		// Before envtest removes the certificates it runs on.
		if err := c.stopAPIServer(c.apiServer.Process.Pid); err != nil {
			return fmt.Errorf("stopping control plane: %w", err)
		}
	}
	if err := c.env.Stop(); err != nil {
		return fmt.Errorf("stopping control plane: %w", err)
	}
	return nil
}

// setControlPlaneGOGC sets GOGC for the processes Start launches (envtest
// runs them with this process's environment and has no option of its own)
// and returns what undoes it. A GOGC the user set is left alone.
func setControlPlaneGOGC(gogc string) (restore func()) {
	if _, set := os.LookupEnv("GOGC"); set {
		return func() {}
	}
	_ = os.Setenv("GOGC", gogc)
	return func() { _ = os.Unsetenv("GOGC") }
}

func existing(flag *bool) bool {
	if flag != nil {
		return *flag
	}
	return strings.EqualFold(os.Getenv("USE_EXISTING_CLUSTER"), "true")
}

// Assets is the folder that holds the etcd and kube-apiserver binaries:
// $KUBEBUILDER_ASSETS, else the repository's bin/k8s. Whatever runs an etcd
// of its own (the config center) takes it from where the control plane does.
func Assets() (string, error) {
	if dir := os.Getenv(AssetsEnv); dir != "" {
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return assets(root), nil
}

func assets(root string) string {
	if dir := os.Getenv(AssetsEnv); dir != "" {
		return dir
	}
	return filepath.Join(root, "bin", "k8s")
}

// checkAssets fails early, with the command that fixes it, when the binaries
// are missing: envtest's own error names a path but not the remedy.
func checkAssets(dir string) error {
	var missing []string
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s missing in %s: run `make controlplane` (or set %s to a folder holding them)",
			strings.Join(missing, " and "), dir, AssetsEnv)
	}
	return nil
}

// RepoRoot finds the kshard repository from the working directory, so tests
// in any package and binaries run from a checkout find bin/ and deploy/.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding repository root: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module github.com/kshard/kshard\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding repository root: no go.mod of github.com/kshard/kshard above the working directory")
		}
		dir = parent
	}
}
