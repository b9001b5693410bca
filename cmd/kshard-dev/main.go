// Command kshard-dev is what `make run` runs: the whole system on one
// machine, with a guided tour of handover, so a newcomer can see kshard work
// without a cluster. It is a binary of its own, not a `kshard` subcommand,
// because it starts a control plane through controller-runtime's envtest,
// whose package init writes to the file system: linked into the replica
// binary, it made every replica on a read-only root file system panic at
// start.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kshard/kshard/internal/sandbox"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newDevCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kshard-dev:", err)
		os.Exit(1)
	}
}

func newDevCommand() *cobra.Command {
	var opts sandbox.Options
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:           "kshard-dev",
		SilenceUsage:  true,
		SilenceErrors: true,
		Short:         "The local sandbox: control plane, config center, sample objects, replicas, live view and a handover tour (what `make run` runs)",
		Long: `kshard-dev starts a real control plane (etcd and kube-apiserver) on loopback with kshard's CRD,
the config center in process, sample ConfigBindings, and kshard controller replicas as child
processes of the kshard binary (--kshard). It shows a live view of the replicas, then hands shards over three
ways (graceful leave, join, crash), printing how long each took, and keeps running until
Ctrl-C (or --duration). Everything it started is stopped when it ends.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger := zap.New(zap.UseFlagOptions(&zapOpts))
			ctrl.SetLogger(logger)
			opts.Out = cmd.OutOrStdout()
			if opts.Executable == "" {
				self, err := os.Executable()
				if err != nil {
					return fmt.Errorf("finding the kshard binary beside this one (or give --kshard): %w", err)
				}
				opts.Executable = filepath.Join(filepath.Dir(self), "kshard")
			}
			if _, err := os.Stat(opts.Executable); err != nil {
				return fmt.Errorf("the replicas' binary: %w (build it with `make build`, or give --kshard)", err)
			}
			return sandbox.Run(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Executable, "kshard", "", "the kshard binary the replicas run (default: kshard beside this binary, as `make build` puts them)")
	f.DurationVar(&opts.Duration, "duration", 0, "keep running this long after the tour, then stop (0: until Ctrl-C)")
	f.StringVar(&opts.Dir, "dir", "", "folder for the kubeconfig and the replicas' logs (default bin/dev in the repository)")
	f.IntVar(&opts.Replicas, "replicas", 3, "controller replicas to run")
	f.IntVar(&opts.Objects, "objects", 120, "sample ConfigBindings to create")
	f.IntVar(&opts.Shards, "shards", 0, "the ring's shard count (default: the controller's, 64)")
	f.IntVar(&opts.Domains, "domains", 12, "business domains to seed in the config center and spread the objects over")
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	zapOpts.BindFlags(fs)
	f.AddGoFlagSet(fs)
	return cmd
}
