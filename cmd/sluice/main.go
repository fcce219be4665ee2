// Command sluice is a drop-in replacement for kube-proxy: it watches Services and
// EndpointSlices and programs this node's kernel (iptables, nftables or ipvs) so that
// traffic to Services reaches their endpoints.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json, as kube-proxy has
)

func main() {
	os.Exit(run())
}

// run executes the command line and returns the process exit code. Logs are flushed
// before it returns, so nothing is lost to os.Exit.
func run() int {
	logs.InitLogs()
	defer logs.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
