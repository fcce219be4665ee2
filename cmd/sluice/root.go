package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/version"
)

// execute runs the sluice command line with args and returns the exit code: 0 on success
// (including --help, --version and --write-config-to), 1 on any error, or the code a
// subcommand chose (see status.go: status and explain document theirs).
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := newRootCommand(stdout, stderr)
	cmd.SetArgs(args)
	return exitCode(cmd.ExecuteContext(ctx), stderr)
}

// exitCode turns what a command returned into the process exit code, printing the error
// (unless an exitCodeError says the command has printed what it had to).
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	code := 1
	var withCode *exitCodeError
	if errors.As(err, &withCode) {
		code = withCode.code
		if withCode.err == nil {
			return code
		}
	}
	fmt.Fprintf(stderr, "Error: %v\n", err)
	return code
}

// newRootCommand builds `sluice`: run the proxy (the default), or the `version`, `status`,
// `explain`, `render` and `config check` subcommands.
func newRootCommand(stdout, stderr io.Writer) *cobra.Command {
	opts := config.NewOptions()
	var printVersion bool

	cmd := &cobra.Command{
		Use:   "sluice",
		Short: "A drop-in replacement for kube-proxy",
		Long: `sluice runs on every node of a Kubernetes cluster. It watches Services and
EndpointSlices and programs this node's kernel (iptables, nftables or ipvs) so that
connections to a Service's virtual IPs and ports reach one of its endpoints.

It reads the same KubeProxyConfiguration file (--config) and flags as kube-proxy.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true, // a configuration error is not a usage error
		SilenceErrors: true, // execute prints the error once
		RunE: func(cmd *cobra.Command, _ []string) error {
			if printVersion {
				_, err := fmt.Fprintln(stdout, versionLine())
				return err
			}
			return runProxy(cmd.Context(), cmd.Flags(), opts)
		},
	}
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	// Accept --iptables_sync_period as well as --iptables-sync-period, as kube-proxy does.
	cmd.SetGlobalNormalizationFunc(cliflag.WordSepNormalizeFunc)

	fs := cmd.Flags()
	opts.AddFlags(fs)
	fs.BoolVar(&printVersion, "version", false, "Print the version and exit.")
	_ = cmd.MarkFlagFilename("config", "yaml", "yml", "json")

	cmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(stdout, versionLine())
			return err
		},
	})
	cmd.AddCommand(newStatusCommand(stdout), newExplainCommand(stdout), newRenderCommand(stdout), newConfigCommand(stdout, stderr))
	return cmd
}

func versionLine() string {
	return "sluice " + version.Version
}

// runProxy completes the options, sets up logging, then either writes the configuration
// (--write-config-to) or hands over to app.Run.
func runProxy(ctx context.Context, fs *pflag.FlagSet, opts *config.Options) error {
	if err := opts.Complete(fs); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApplyAsField(&opts.Config.Logging, opts.FeatureGates, field.NewPath("logging")); err != nil {
		return fmt.Errorf("initializing logging: %w", err)
	}
	logger := klog.FromContext(ctx)
	logConfigWarnings(logger, opts)
	for _, flag := range opts.IgnoredFlags {
		logger.Info("Warning: flag ignored because --config is given", "flag", flag, "config", opts.ConfigFile)
	}
	if len(opts.IgnoredFeatureGates) > 0 {
		logger.Info("Warning: "+config.IgnoredFeatureGatesWarning(opts.IgnoredFeatureGates), "ignoredGates", opts.IgnoredFeatureGates)
	}

	if opts.WriteConfigTo != "" {
		if err := config.WriteFile(opts.WriteConfigTo, opts.Config); err != nil {
			return err
		}
		logger.Info("Wrote configuration", "file", opts.WriteConfigTo)
		return nil
	}
	return app.Run(ctx, opts)
}

// logConfigWarnings logs, as an error, each field of the configuration file that upstream's
// lenient decoding accepts and strict decoding refuses: sluice starts with it, as upstream
// does, but the operator must see it (app.Run also counts it and puts it in an Event).
func logConfigWarnings(logger klog.Logger, opts *config.Options) {
	for _, w := range opts.ConfigWarnings {
		msg := "Unknown configuration field ignored; run `sluice config check` on the file"
		if w.Kind == config.DuplicateField {
			msg = "Configuration field set more than once, the last value is used; run `sluice config check` on the file"
		}
		logger.Error(nil, msg, "field", w.Path, "config", opts.ConfigFile)
	}
}
