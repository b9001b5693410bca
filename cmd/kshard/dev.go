package main

import (
	"github.com/spf13/cobra"

	"github.com/kshard/kshard/internal/sandbox"
)

// newDevCommand is `kshard dev`, what `make run` runs: the whole system on
// one machine, with a guided tour of handover, so a newcomer can see kshard
// work without a cluster.
func newDevCommand() *cobra.Command {
	var opts sandbox.Options
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the local sandbox: control plane, config center, sample objects, replicas, live view and a handover tour (what `make run` does)",
		Long: `dev starts a real control plane (etcd and kube-apiserver) on loopback with kshard's CRD,
the config center in process, sample ConfigBindings, and kshard controller replicas as child
processes of this binary. It shows a live view of the replicas, then hands shards over three
ways (graceful leave, join, crash), printing how long each took, and keeps running until
Ctrl-C (or --duration). Everything it started is stopped when it ends.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Out = cmd.OutOrStdout()
			return sandbox.Run(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&opts.Duration, "duration", 0, "keep running this long after the tour, then stop (0: until Ctrl-C)")
	f.StringVar(&opts.Dir, "dir", "", "folder for the kubeconfig and the replicas' logs (default bin/dev in the repository)")
	f.IntVar(&opts.Replicas, "replicas", 3, "controller replicas to run")
	f.IntVar(&opts.Objects, "objects", 120, "sample ConfigBindings to create")
	f.IntVar(&opts.Domains, "domains", 12, "business domains to seed in the config center and spread the objects over")
	return cmd
}
