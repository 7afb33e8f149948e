// Command clodexctl is the control plane's admin API as a CLI.
//
//	clodexctl [--control-plane ADDR[,ADDR...]] [--token-file FILE] [-o table|json] COMMAND ...
//
//	set-rate ACCOUNT RATE [--burst N]
//	set-budget ACCOUNT [--idle-timeout D] [--total-timeout D] [--max-retries N]
//	set-adaptive ACCOUNT on|off
//	get ACCOUNT
//	accounts
//	quota [ACCOUNT]
//	account login | import --codex-auth FILE | list | show ACCOUNT | remove ACCOUNT
//	agents
//	agent create NAME --accounts ACCOUNT[,ACCOUNT...] --out FILE | list | remove NAME
//	top [--interval D] [--once]
//	health [--store] [--wait D] [URL]
//
// --control-plane takes what the data planes' --control-plane takes: one
// address, the replicas' comma-separated list (a call goes to a replica
// that answers) or dns:///host:port. top is a live terminal view per
// account (configured and effective rate, bucket level, admissions,
// waits, refusals and upstream 403s per minute, agents, plan usage),
// redrawn every --interval until Ctrl-C. health exits 0 when the control
// plane's gRPC health is SERVING (no token needed; --store: its store
// too), or when URL answers 200; container and unit health checks run it
// without a shell, and --wait D lets a start-up script wait for a server.
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
