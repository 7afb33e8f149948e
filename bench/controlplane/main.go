// Command controlplane-bench is the control plane's load generator. It runs
// as its own process, dials a running clodex-controlplane, and for every
// combination of --accounts and --inflight drives the no-op floor
// (BenchService.Noop, same authentication and message sizes) and Admit
// back to back for --duration each, then prints throughput, p50 and p99
// side by side with Admit/floor ratios.
//
//	controlplane-bench --addr 127.0.0.1:17700 --token-file agent.token \
//	    --inflight 1,16,64 --accounts 1,10000 --duration 3s
//
// The server must run with --bench-service. scripts/bench-controlplane.sh
// builds both binaries, starts the server and runs this.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "controlplane-bench:", err)
		os.Exit(1)
	}
}
