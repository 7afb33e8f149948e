// Command clodex-controlplane serves the control plane's gRPC API:
// admissions, per-account policy, health and reflection.
//
//	clodex-controlplane --listen 127.0.0.1:17700 --data-dir /var/lib/clodex \
//	    --admin-token-file admin.token --agent-token-file agent.token \
//	    [--admin-listen 127.0.0.1:17701] [--tls-cert F --tls-key F [--client-ca F]]
//
// Replicas share one Redis instead of a data directory; run any number:
//
//	CLODEX_REDIS_URL=redis://:PASSWORD@redis:6379/0 clodex-controlplane --listen 0.0.0.0:17700 \
//	    --admin-token-file admin.token --agent-token-file agent.token [--redis-timeout 100ms]
//
// Run with --help for every flag and its environment variable.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is stamped at build time: -ldflags "-X main.version=$(git describe --tags --always --dirty)".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clodex-controlplane:", err)
		os.Exit(1)
	}
}
