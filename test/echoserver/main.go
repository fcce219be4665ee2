// Command echoserver is the test workload of sluice's conformance suite: a static binary run
// inside a pod's network namespace (`ip netns exec`).
//
//	echoserver [serve] -pod NAME -ports 8080,8081 -protocols tcp,udp,sctp
//	echoserver probe -proto tcp -target 10.96.0.10:80 [-timeout 1.5s] [-source IP] [-count N]
//
// serve answers each TCP/SCTP connection and UDP datagram with one line,
// "pod=<name> local=<ip:port> remote=<ip:port> proto=<proto>" (package echo). SCTP listeners
// are skipped, with a log line, where the kernel has no SCTP sockets.
//
// probe connects (or sends from one UDP socket, keeping its source port, when -count > 1)
// and prints one classified outcome per try: "answered pod=...", "refused: ...",
// "timeout: ...", "unreachable: ..." or "failed: ...". It exits 0 when every try was
// answered, 1 otherwise.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluiceproxy/sluice/test/echoserver/echo"
)

func main() {
	args := os.Args[1:]
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = serve(args)
	case "probe":
		var ok bool
		ok, err = probe(args)
		if err == nil && !ok {
			os.Exit(1)
		}
	default:
		err = fmt.Errorf("unknown command %q (want serve or probe)", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "echoserver:", err)
		os.Exit(2)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	host, _ := os.Hostname()
	pod := fs.String("pod", envOr("POD_NAME", host), "name put in every reply (default $POD_NAME, else the hostname)")
	ports := fs.String("ports", "8080", "comma-separated ports to listen on")
	protocols := fs.String("protocols", "tcp,udp,sctp", "comma-separated protocols; sctp is skipped where the kernel lacks it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := echo.ServerConfig{Pod: *pod, Logf: log.Printf}
	for _, p := range splitList(*ports) {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("bad port %q", p)
		}
		cfg.Ports = append(cfg.Ports, uint16(n))
	}
	for _, p := range splitList(*protocols) {
		proto, err := echo.ParseProtocol(p)
		if err != nil {
			return err
		}
		cfg.Protocols = append(cfg.Protocols, proto)
	}
	srv, err := echo.Listen(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log.Printf("serving pod=%s ports=%s protocols=%s skipped=%v", cfg.Pod, *ports, *protocols, srv.Skipped)
	return srv.Serve(ctx)
}

func probe(args []string) (bool, error) {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	protoFlag := fs.String("proto", "tcp", "tcp, udp or sctp")
	targetFlag := fs.String("target", "", "ip:port to probe")
	timeout := fs.Duration("timeout", echo.DefaultTimeout, "wait this long for each answer")
	sourceFlag := fs.String("source", "", "bind this source address")
	count := fs.Int("count", 1, "number of tries; UDP tries reuse one socket (same source port)")
	interval := fs.Duration("interval", 0, "pause between tries")
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	proto, err := echo.ParseProtocol(*protoFlag)
	if err != nil {
		return false, err
	}
	target, err := netip.ParseAddrPort(*targetFlag)
	if err != nil {
		return false, fmt.Errorf("-target: %w", err)
	}
	var source netip.Addr
	if *sourceFlag != "" {
		if source, err = netip.ParseAddr(*sourceFlag); err != nil {
			return false, fmt.Errorf("-source: %w", err)
		}
	}
	var udp *echo.UDPClient
	if proto == echo.UDP {
		if udp, err = echo.DialUDP(target, source); err != nil {
			return false, err
		}
		defer udp.Close()
	}
	allAnswered := true
	for i := range *count {
		if i > 0 && *interval > 0 {
			time.Sleep(*interval)
		}
		var out echo.Outcome
		if udp != nil {
			out = udp.Send(*timeout)
		} else {
			out = echo.Probe(context.Background(), proto, target, echo.ProbeOptions{Timeout: *timeout, Source: source})
		}
		fmt.Println(out)
		allAnswered = allAnswered && out.Result == echo.Answered
	}
	return allAnswered, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
