// Package sandbox is the local kshard playground behind `make run`: a real
// control plane on loopback with kshard's CRDs, and a kubeconfig for kubectl.
// It exists so a newcomer sees kshard work with one command and no cluster.
package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"

	"github.com/kshard/kshard/internal/controlplane"
)

// Options configure a sandbox run.
type Options struct {
	// Dir holds the sandbox's files (the kubeconfig). Defaults to
	// <repository>/bin/dev, else a temporary folder.
	Dir string
	// Duration stops the sandbox after this long; zero runs until the
	// context is cancelled (Ctrl-C).
	Duration time.Duration
	// Out receives what a person reads. Defaults to os.Stdout.
	Out io.Writer
}

func (o *Options) setDefaults() error {
	if o.Out == nil {
		o.Out = os.Stdout
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
	return os.MkdirAll(o.Dir, 0o755)
}

// Run starts the sandbox and blocks until ctx is done or the duration
// passes, then stops everything it started.
func Run(ctx context.Context, opts Options) error {
	if err := opts.setDefaults(); err != nil {
		return err
	}
	log := logr.FromContextOrDiscard(ctx)
	kubeconfig := filepath.Join(opts.Dir, "kubeconfig")

	fmt.Fprintln(opts.Out, "starting the local control plane (etcd + kube-apiserver) ...")
	start := time.Now()
	cp, err := controlplane.Start(controlplane.Options{KubeconfigPath: kubeconfig})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(opts.Out, "stopping the control plane ...")
		if err := cp.Stop(); err != nil {
			log.Error(err, "Stopping the control plane")
		}
	}()
	fmt.Fprintf(opts.Out, "control plane ready in %s with the ConfigBinding CRD installed\n\n", time.Since(start).Round(100*time.Millisecond))
	fmt.Fprintf(opts.Out, "  export KUBECONFIG=%s\n", kubeconfig)
	fmt.Fprintf(opts.Out, "  kubectl get configbindings -A\n\n")

	if opts.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Duration)
		defer cancel()
		fmt.Fprintf(opts.Out, "running for %s (Ctrl-C stops earlier)\n", opts.Duration)
	} else {
		fmt.Fprintln(opts.Out, "running until Ctrl-C")
	}
	<-ctx.Done()
	return nil
}
