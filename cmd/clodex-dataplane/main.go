// Command clodex-dataplane serves the Anthropic Messages API on a local
// listener and runs each turn on the ChatGPT Codex backend, keeping upstream
// sockets as continuation heads and asking a control plane before it opens
// a new one:
//
//	clodex-dataplane [--listen ADDR] [--upstream-url URL] [--codex-auth FILE]
//	    [--token-endpoint URL] [--refresh auto|never] [--admin-listen ADDR]
//	    [--api-key-file FILE | --member-keys] [--allowed-origins LIST] [--model-aliases SPEC]
//	    [--model-passthrough] [--failure-retries 1]
//	    [--control-plane ADDR --agent-token-file FILE [--tls-ca FILE]
//	     [--tls-cert FILE --tls-key FILE]] [--data-dir DIR]
//	    [--ws-diagnostics FILE|-] [--shutdown-grace 30s] [--log-level info]
//	    [--version]
//
// Without --control-plane it serves one embedded in-process, over an
// in-process gRPC listener and through the same client path as a remote
// one, so a single user runs one command. The embedded control plane keeps
// policies in memory, or in DIR/policy.json with --data-dir. With
// --control-plane ADDR (and --agent-token-file FILE or CLODEX_AGENT_TOKEN)
// the data plane joins that fleet: it registers as an agent, receives its
// accounts' policies, reports upstream 403s, and does not refresh
// auth.json unless --refresh=auto (standalone, auto is the default). ADDR
// may list several replicas (a:17700,b:17700) or name one DNS name with
// several records (dns:///cp.example:17700 or plain host:port); RPCs are
// balanced over the replicas whose store is healthy and fail over to
// another on error. With --member-keys (CLODEX_MEMBER_KEYS=true) it
// serves only the keys of the team's members, which the control plane
// pushes, on any listener.
//
// Environment (documented defaults): CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN
// (60; 0 disables pacing), CLODEX_UPSTREAM_IDLE_TIMEOUT_MS (120000),
// CLODEX_UPSTREAM_TOTAL_TIMEOUT_MS (600000), CLODEX_UPSTREAM_MAX_RETRIES (5)
// set the default policy (the embedded control plane's and the local
// fallback's) and every turn's budget, with a one-time notice for each
// value ignored or adjusted; CLODEX_WS_MAX_CONNECTIONS and
// CLODEX_WS_MAX_NURSERY_CONNECTIONS cap the pool (unbounded); CODEX_HOME
// locates auth.json; OTEL_EXPORTER_OTLP_* enable tracing.
//
// Defaults: --listen 127.0.0.1:17645, --upstream-url
// wss://chatgpt.com/backend-api/codex/responses, --codex-auth
// $CODEX_HOME/auth.json or ~/.codex/auth.json. Nothing else listens unless
// --admin-listen is given, so several data planes run side by side on one
// host. When ready it prints one line for the shell,
// "export ANTHROPIC_BASE_URL=http://ADDR  # …"; on loopback any
// ANTHROPIC_API_KEY works. SIGINT/SIGTERM stop accepting, let in-flight
// turns finish within --shutdown-grace (then end the rest with 503 and drop
// their sockets), close the idle upstream sockets with 1001, deregister
// from the control plane and stop the embedded one. Bad flags exit 2 with one message naming every problem.
//
// The data plane itself is assembled by package internal/node; this
// command parses flags and the environment into its Config.
//
//	clodex-dataplane claude [ARGS...]
//
// runs the user's Claude Code (claude on PATH, with ARGS) on the data plane
// that answers on 127.0.0.1:17645 (CLODEX_LISTEN), or on one it starts for
// the session with default flags, in front of clodex-sim (found beside this
// binary or on PATH) when there are no Codex credentials. It writes nothing
// to Claude Code's settings; see claude.go for the environment Claude Code
// gets. The exit status is Claude Code's.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/clodex/clodex/internal/node"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "claude" {
		os.Exit(mainClaude(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clodex-dataplane:", err)
		if errors.As(err, new(*usageError)) || errors.As(err, new(*node.ConfigError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}
