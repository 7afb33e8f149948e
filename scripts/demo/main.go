// Command demo is make demo: the recommended team set-up of
// docs/operations.md §1.1 on loopback — Redis, two control-plane replicas
// over it running the credential broker, the account signed in once
// (clodexctl account import), a scoped agent token per data plane
// (clodexctl agent create) and two data planes without an auth.json, in
// front of clodex-sim — traced into Jaeger; a scripted fan-out of new
// conversations through both data planes; then, once Jaeger holds every
// span of every request, a summary and the URL of one trace that shows a
// turn, its attempt and the Admit call continued inside a control-plane
// replica.
//
//	go run ./scripts/demo --bin bin --jaeger ~/.cache/clodex/jaeger/jaeger-v1.76.0 [--ui DIR] [--exit]
//
// Jaeger is built from the module pinned in tools/jaeger (scripts/build-jaeger.sh);
// that build serves a placeholder page instead of the Jaeger UI, whose
// assets are not in the Go module. --ui DIR (or CLODEX_JAEGER_UI) serves a
// built Jaeger UI (its index.html and static/) instead; without it the
// demo says so and the trace is still there through Jaeger's API.
//
// The processes are told apart in the trace by OTEL_SERVICE_NAME
// (clodex-controlplane-1 and -2, clodex-dataplane-1 and -2). Everything
// runs until Ctrl-C, then stops in order; --exit stops right after the
// summary. The folder with every process's log, the tokens and Redis's
// data is kept either way, and named.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	home, _ := os.UserHomeDir()
	o := options{}
	flag.StringVar(&o.bin, "bin", "bin", "folder with the clodex binaries (make build)")
	flag.StringVar(&o.jaeger, "jaeger", filepath.Join(home, ".cache", "clodex", "jaeger", "jaeger-v1.76.0"), "the Jaeger binary (scripts/build-jaeger.sh)")
	flag.StringVar(&o.ui, "ui", os.Getenv("CLODEX_JAEGER_UI"), "a built Jaeger UI to serve (index.html and static/); default: Jaeger's own page")
	flag.StringVar(&o.uiAddr, "ui-listen", "127.0.0.1:16686", "address of Jaeger's UI and query API")
	flag.IntVar(&o.fanOut, "fan-out", 8, "new conversations at once per data plane (1..50)")
	flag.StringVar(&o.redis, "redis-server", "redis-server", "the redis-server executable the replicas share")
	exit := flag.Bool("exit", false, "stop after the summary instead of waiting for Ctrl-C")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "demo: unexpected argument %q; the demo takes flags only (see -h)\n", flag.Arg(0))
		os.Exit(2)
	}
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	dir, err := os.MkdirTemp("", "clodex-demo-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	o.dir = dir
	d, err := start(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	d.printSummary(os.Stdout)
	if !*exit {
		fmt.Println("\nEverything keeps running; Ctrl-C stops it. Logs:", dir)
		<-ctx.Done()
		fmt.Println("\nStopping.")
	}
	d.close()
	// The logs stay: they are what one reads after a run.
	fmt.Printf("Stopped. The logs, tokens and Redis data are kept in %s (remove it when done).\n", dir)
	if d.failed() {
		os.Exit(1)
	}
}
