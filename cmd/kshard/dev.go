package main

import (
	"github.com/spf13/cobra"

	"github.com/kshard/kshard/internal/sandbox"
)

func newDevCommand() *cobra.Command {
	var opts sandbox.Options
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Start the local sandbox on an embedded control plane (what `make run` does)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Out = cmd.OutOrStdout()
			return sandbox.Run(cmd.Context(), opts)
		},
	}
	cmd.Flags().DurationVar(&opts.Duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	cmd.Flags().StringVar(&opts.Dir, "dir", "", "folder for the sandbox's files (default bin/dev in the repository)")
	return cmd
}
