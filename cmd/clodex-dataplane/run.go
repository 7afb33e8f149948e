package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/clodex/clodex/internal/node"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

// run starts the data plane and serves until ctx ends, then shuts down in
// the order written in node.Node.Close.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runEnv(ctx, args, osLookupEnv, stdout, stderr)
}

// runEnv is run with the environment injected (tests).
func runEnv(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	cfg, err := loadConfig(args, lookupEnv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if cfg.Version {
		fmt.Fprintln(stdout, "clodex-dataplane", version)
		return nil
	}
	n, err := node.Start(ctx, cfg.Config, stdout, stderr)
	if err != nil {
		return err
	}
	return n.Serve(ctx)
}
