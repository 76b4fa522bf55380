// Command kwok is the Kubernetes SIG tool that simulates nodes and pods, so workloads become
// Ready on idem's local control plane without a container runtime.
package main

import (
	"os"

	"github.com/spf13/pflag"

	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/kwok/cmd"
	"sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

func main() {
	flags := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flags.ParseErrorsAllowlist.UnknownFlags = true
	flags.Usage = func() {}

	ctx := signals.SetupSignalContext()
	ctx, logger := log.InitFlags(ctx, flags)
	ctx, err := config.InitFlags(ctx, flags)
	if err != nil {
		logger.Error("init config flags", "err", err)
		os.Exit(1)
	}
	root := cmd.NewCommand(ctx)
	root.PersistentFlags().AddFlagSet(flags)
	if err := root.ExecuteContext(ctx); err != nil {
		logger.Error("kwok exited", "err", err)
		os.Exit(1)
	}
}
