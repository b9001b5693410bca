// Command kshard runs a replica of the sharded ConfigBinding controller and
// shows the state of a ring. The local sandbox is cmd/kshard-dev.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kshard:", err)
		if errors.Is(err, errUnowned) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	zapOpts := zap.Options{}
	root := &cobra.Command{
		Use:           "kshard",
		Short:         "A sharded, multi-replica Kubernetes controller",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, _ []string) {
			logger := zap.New(zap.UseFlagOptions(&zapOpts))
			ctrl.SetLogger(logger)
			cmd.SetContext(ctrl.LoggerInto(cmd.Context(), logger))
		},
	}
	zapFlags := flagSetOf(zapOpts.BindFlags)
	root.PersistentFlags().AddGoFlagSet(zapFlags)
	root.AddCommand(newControllerCommand(), newStatusCommand(), newFencingCommand())
	return root
}
