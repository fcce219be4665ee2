// Command sandbox builds, prints and tears down the sluice sandbox; hack/demo.sh runs it
// (`make demo`, `make demo-down`).
//
//	sandbox up   --run-dir DIR --mode iptables|nftables|ipvs --sluice BIN --echoserver BIN [--once] [-v]
//	sandbox down --run-dir DIR
//
// up builds the sandbox (package sandbox), prints what it built, what clients get through
// each Service and where to look, then stays up until SIGINT or SIGTERM (or, with --once,
// tears down at once) and removes everything. Its exit status is 0 when every client got
// what it should, 1 otherwise (or on any error). down stops the sandbox of a run directory
// from another shell, or removes what a killed one left.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluiceproxy/sluice/test/sandbox"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "up":
		os.Exit(up(os.Args[2:]))
	case "down":
		os.Exit(down(os.Args[2:]))
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sandbox up --run-dir DIR --mode MODE --sluice BIN --echoserver BIN [--once] [-v]\n       sandbox down --run-dir DIR")
	os.Exit(2)
}

func up(args []string) int {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	var opts sandbox.Options
	fs.StringVar(&opts.RunDir, "run-dir", "", "run directory (state, logs, kubeconfig); removed on tear-down")
	fs.StringVar(&opts.Mode, "mode", "iptables", "sluice's mode: iptables, nftables or ipvs")
	fs.StringVar(&opts.Sluice, "sluice", "bin/sluice", "the sluice binary")
	fs.StringVar(&opts.EchoServer, "echoserver", "bin/echoserver", "the echo server binary")
	once := fs.Bool("once", false, "print, then tear down at once (for tests and CI)")
	verbose := fs.Bool("v", false, "print the details of every step")
	_ = fs.Parse(args)
	if opts.RunDir == "" {
		fmt.Fprintln(os.Stderr, "sandbox: --run-dir is required")
		return 2
	}
	opts.Progress = os.Stdout
	if *verbose {
		opts.Log = os.Stderr
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := sandbox.Up(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
		return 1
	}
	code := 0
	fmt.Println()
	if err := s.Describe(os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
	}
	fmt.Println("\nWhat clients get (each line: several new connections; ok: what this Service must do):")
	ok, err := s.Probe(os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
	}
	if !ok {
		code = 1
		fmt.Fprintln(os.Stderr, "\nsandbox: some clients did not get what they should (FAIL lines above)")
		fmt.Fprint(os.Stderr, s.SluiceLogTails(20))
	}

	if !*once {
		fmt.Printf("\nThe sandbox stays up. Ctrl-C here, or `make demo-down` (hack/demo.sh down) from another shell, tears it down.\n")
		wait(ctx, s)
	}
	fmt.Println("\nTearing down...")
	start := time.Now()
	if err := s.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
		return 1
	}
	fmt.Printf("Torn down in %.1fs: no network namespace, link, process or directory of this sandbox is left.\n", time.Since(start).Seconds())
	return code
}

// wait blocks until a signal comes or a sluice process dies (which it reports).
func wait(ctx context.Context, s *sandbox.Sandbox) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if err := s.Failed(); err != nil {
				fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
				return
			}
		}
	}
}

func down(args []string) int {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	runDir := fs.String("run-dir", "", "run directory of the sandbox to tear down")
	_ = fs.Parse(args)
	if *runDir == "" {
		fmt.Fprintln(os.Stderr, "sandbox: --run-dir is required")
		return 2
	}
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stdout, "sandbox: "+f+"\n", a...) }
	if err := sandbox.Down(*runDir, logf); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox: %v\n", err)
		return 1
	}
	logf("nothing is left")
	return 0
}
