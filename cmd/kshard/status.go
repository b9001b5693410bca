package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
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
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			rules.ExplicitPath = kubeconfig
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
			if err != nil {
				return fmt.Errorf("loading kubeconfig: %w", err)
			}
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			_ = configv1alpha1.AddToScheme(scheme)
			c, err := client.New(cfg, client.Options{Scheme: scheme})
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
