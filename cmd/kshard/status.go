package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/kshard/kshard/api/v1alpha1"
	"github.com/kshard/kshard/internal/replica"
	"github.com/kshard/kshard/sharding"
	"github.com/kshard/kshard/sharding/ring"
)

// errUnowned makes `kshard status` exit non-zero when shards are unowned,
// so scripts and probes can act on it.
var errUnowned = errors.New("some shards are unowned")

func newStatusCommand() *cobra.Command {
	var kubeconfig, namespace, ringName, prefix, kind string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the ring: each shard's holder and desired owner, each member, unowned shards (exit 2 if any)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			gvk, err := parseKind(kind)
			if err != nil {
				return err
			}
			cfg, err := loadConfig(kubeconfig)
			if err != nil {
				return err
			}
			c, err := client.New(cfg, client.Options{Scheme: replica.Scheme()})
			if err != nil {
				return err
			}
			st, err := ring.ReadStatus(cmd.Context(), c, ring.StatusOptions{Namespace: namespace, Ring: ringName, Kind: gvk, LabelPrefix: prefix})
			if err != nil {
				return err
			}
			printStatus(cmd.OutOrStdout(), st)
			if len(st.Unowned) > 0 {
				return errUnowned
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the usual loading rules)")
	cmd.Flags().StringVar(&namespace, "lease-namespace", "kshard-system", "namespace of the ring's Leases")
	cmd.Flags().StringVar(&ringName, "ring", "kshard", "ring name")
	cmd.Flags().StringVar(&prefix, "label-prefix", sharding.DefaultLabelPrefix, "the ring's label prefix (sharding.Options.LabelPrefix)")
	cmd.Flags().StringVar(&kind, "kind", "ConfigBinding.v1alpha1."+configv1alpha1.GroupVersion.Group,
		"the ring's primary kind, whose objects are counted per shard, as Kind.version.group (ConfigMap.v1. for a core kind)")
	return cmd
}

// parseKind reads --kind: Kind.version.group, the group empty for a core
// kind.
func parseKind(s string) (schema.GroupVersionKind, error) {
	gvk, _ := schema.ParseKindArg(s)
	if gvk == nil || gvk.Kind == "" || gvk.Version == "" {
		return schema.GroupVersionKind{}, fmt.Errorf("--kind %q: want Kind.version.group, e.g. ConfigMap.v1. or ConfigBinding.v1alpha1.config.kshard.dev", s)
	}
	return *gvk, nil
}

// printStatus writes a ring's status as tables a person reads.
func printStatus(w io.Writer, st *ring.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ring %s: %d shards, %d unowned, %d unlabeled objects\n\n", st.Ring, st.ShardCount, len(st.Unowned), st.Unlabeled)
	fmt.Fprintln(tw, "MEMBER\tLIVE\tSHARD COUNT\tHELD\tDESIRED\tRENEWED")
	for _, m := range st.Members {
		fmt.Fprintf(tw, "%s\t%v\t%d\t%d\t%d\t%s ago\n", m.Name, m.Live, m.ShardCount, m.Held, m.Desired, m.RenewAge.Round(time.Second))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "SHARD\tHOLDER\tDESIRED\tLEASE AGE\tOBJECTS")
	for _, s := range st.Shards {
		holder, age := s.Holder, s.LeaseAge.Round(time.Second).String()
		if holder == "" {
			holder, age = "<none>", "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\n", s.Shard, holder, s.Desired, age, s.Objects)
	}
	_ = tw.Flush()
	if len(st.Unowned) > 0 {
		fmt.Fprintf(w, "\nUNOWNED SHARDS (their objects are not reconciled): %v\n", st.Unowned)
	}
}
