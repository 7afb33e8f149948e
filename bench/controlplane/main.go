// Command controlplane-bench is the control plane's load generator. It runs
// as its own process, dials a running clodex-controlplane, and for every
// combination of --accounts and --inflight drives the no-op floor
// (BenchService.Noop, same authentication and message sizes), Admit on the
// memory store and, with --redis-addr, Admit on a control plane serving
// from Redis, back to back for --duration each, then prints throughput,
// p50 and p99 side by side with ratios to the floor.
//
//	controlplane-bench --addr 127.0.0.1:17700 --redis-addr 127.0.0.1:17710 \
//	    --token-file agent.token --modes noop,admit,redis \
//	    --inflight 1,16,64 --accounts 1,10000 --duration 3s
//
// The servers must run with --bench-service and share the agent token. scripts/bench-controlplane.sh
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
