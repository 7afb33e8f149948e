// Command clodexctl is the control plane's admin API as a CLI.
//
//	clodexctl [--control-plane ADDR] [--token-file FILE] [-o table|json] COMMAND ...
//
//	set-rate ACCOUNT RATE [--burst N]
//	set-budget ACCOUNT [--idle-timeout D] [--total-timeout D] [--max-retries N]
//	get ACCOUNT
//	accounts
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
