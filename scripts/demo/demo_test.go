//go:build demo

// The demo's browser test, run by make demo-test (the build tag keeps it
// out of make test: it needs the Jaeger build of scripts/build-jaeger.sh,
// about ten minutes of two cores the first time, Debian's chromium, and a
// built Jaeger UI).
package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

// TestTracePageInChromium runs the demo, then loads its trace page in
// headless Chromium and checks that the page shows the turn, its attempt
// and the Admit call in both planes. The screenshot is kept in
// CLODEX_ARTIFACTS (default bin/demo-artifacts) as trace.png.
func TestTracePageInChromium(t *testing.T) {
	jaeger, bin, ui := os.Getenv("CLODEX_JAEGER"), os.Getenv("CLODEX_BIN"), os.Getenv("CLODEX_JAEGER_UI")
	for name, v := range map[string]string{"CLODEX_JAEGER (scripts/build-jaeger.sh)": jaeger, "CLODEX_BIN (make build's bin)": bin,
		"CLODEX_JAEGER_UI (a built Jaeger UI: index.html and static/; the Go module build of Jaeger has only a placeholder page)": ui} {
		if v == "" {
			t.Fatalf("%s is not set (make demo-test sets the first two)", name)
		}
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed (apt-get install chromium)")
	}
	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	o := options{bin: bin, jaeger: jaeger, ui: ui, dir: t.TempDir(), redis: "redis-server", uiAddr: "127.0.0.1:" + itoa(port), fanOut: 4}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	d, err := start(ctx, o, &progress)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, progress.String())
	}
	t.Cleanup(d.close)
	var summary bytes.Buffer
	d.printSummary(&summary)
	t.Log(summary.String())
	if d.failed() {
		t.Fatal("the demo's fan-out had failed turns or upstream 403s")
	}
	if d.UIPlaceholder {
		t.Fatalf("Jaeger serves its placeholder page although --ui %s was given", ui)
	}

	artifacts := os.Getenv("CLODEX_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(bin, "demo-artifacts")
	}
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifacts, "trace.png")
	browse := func(extra ...string) []byte {
		t.Helper()
		args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--user-data-dir=" + t.TempDir(), "--window-size=1600,1200", "--virtual-time-budget=20000"}, extra...)
		args = append(args, d.TraceURL)
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Minute)
		defer ccancel()
		out, err := exec.CommandContext(cctx, chromium, args...).Output()
		if err != nil {
			t.Fatalf("chromium %v: %v", extra, err)
		}
		return out
	}
	dom := string(browse("--dump-dom"))
	browse("--screenshot=" + shot)
	for _, want := range []string{turnSpan, attemptSpan, admitSpan, controlPlaneService, "clodex-dataplane-"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the trace page does not show %q", want)
		}
	}
	if t.Failed() {
		t.Logf("DOM (first 3000 bytes):\n%.3000s", dom)
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 10_000 {
		t.Errorf("screenshot %s: %v (size %d); want a rendered page", shot, err, sizeOf(fi))
	}
	t.Logf("screenshot: %s", shot)
}

func itoa(n int) string { return strconv.Itoa(n) }

func sizeOf(fi os.FileInfo) int64 {
	if fi == nil {
		return 0
	}
	return fi.Size()
}
