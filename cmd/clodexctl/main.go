// Command clodexctl is the control plane's admin API as a CLI.
//
//	clodexctl [--control-plane ADDR] [--token-file FILE] [-o table|json] COMMAND ...
//
//	set-rate ACCOUNT RATE [--burst N]
//	set-budget ACCOUNT [--idle-timeout D] [--total-timeout D] [--max-retries N]
//	set-adaptive ACCOUNT on|off
//	get ACCOUNT
//	accounts
//	quota [ACCOUNT]
//	agents
//	top [--interval D] [--once]
//	health [URL]
//
// top is a live terminal view per account (configured and effective rate,
// bucket level, admits, waits, refusals and upstream 403s per minute,
// agents), redrawn every --interval until Ctrl-C. health exits 0 when the
// control plane's gRPC health is SERVING (no token needed), or when URL
// answers 200; container and unit health checks run it without a shell.
//
// ACCOUNT is the ChatGPT account id; clodexctl hashes it into the account
// key the way the data plane does, so the control plane never sees the
// raw id. --key KEY addresses a key directly.
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
		fmt.Fprintln(os.Stderr, "clodexctl:", err)
		os.Exit(exitCode(err))
	}
}
