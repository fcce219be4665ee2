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

	// SIGTERM (the kubelet stopping the pod) or Ctrl-C ends ctx: the daemon stops taking
	// new work, lets a sync in progress finish (pkg/syncloop, at most 20 s of the pod's
	// 30 s grace period) and leaves every rule in place. A second signal kills the process
	// at once: the first one's handling ends when ctx does.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	return execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
