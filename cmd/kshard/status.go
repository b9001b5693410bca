package main

import (
	"errors"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
)

// errUnowned makes `kshard status` exit non-zero when shards are unowned,
// so scripts and probes can act on it.
var errUnowned = errors.New("some shards are unowned")

func newStatusCommand() *cobra.Command {
	var kubeconfig, namespace, ring string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the ring: each shard's holder and desired owner, each member, unowned shards (exit 2 if any)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(kubeconfig)
			if err != nil {
				return err
			}
			c, err := client.New(cfg, client.Options{Scheme: replica.Scheme()})
			if err != nil {
				return err
			}
			st, err := sharding.ReadStatus(cmd.Context(), c, namespace, ring,
				configv1alpha1.GroupVersion.WithKind("ConfigBinding"))
			if err != nil {
				return err
			}
			st.Print(cmd.OutOrStdout())
			if len(st.Unowned) > 0 {
				return errUnowned
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the usual loading rules)")
	cmd.Flags().StringVar(&namespace, "lease-namespace", "kshard-system", "namespace of the ring's Leases")
	cmd.Flags().StringVar(&ring, "ring", "kshard", "ring name")
	return cmd
}
