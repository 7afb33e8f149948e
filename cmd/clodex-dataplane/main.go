// Command clodex-dataplane serves the Anthropic Messages API on a local
// listener and runs each turn on the ChatGPT Codex backend:
//
//	clodex-dataplane --listen ADDR --upstream-url URL --codex-auth FILE [--admin-listen ADDR]
//	    [--api-key-file FILE] [--allowed-origins LIST] [--model-aliases SPEC]
//	    [--token-endpoint URL] [--shutdown-grace 30s] [--log-level info] [--version]
//
// Defaults: --listen 127.0.0.1:17645, --upstream-url
// wss://chatgpt.com/backend-api/codex/responses, --codex-auth
// $CODEX_HOME/auth.json or ~/.codex/auth.json. When ready it prints one
// line for the shell, "export ANTHROPIC_BASE_URL=http://ADDR  # …"; on
// loopback any ANTHROPIC_API_KEY works. SIGINT/SIGTERM stop accepting, let
// in-flight turns finish within --shutdown-grace, then close the remaining
// upstream sockets with 1001. Bad flags exit 2 with one message naming
// every problem.
package main

import (
	"context"
	"errors"
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
		fmt.Fprintln(os.Stderr, "clodex-dataplane:", err)
		if errors.As(err, new(*usageError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
