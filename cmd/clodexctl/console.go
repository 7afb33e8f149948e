package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const consoleUsage = "console [--print-url] [--as NAME]"

var consoleCmd = &command{
	name:  "console",
	usage: consoleUsage,
	short: "open the web console: a one-time sign-in link (60 s, one use) to the control plane's /console/",
	run:   runConsole,
}

type consoleArgs struct {
	printURL bool
	as       string
}

func runConsole(ctx context.Context, e *env, args []string) error {
	var a consoleArgs
	fs := e.flagSet("console")
	fs.BoolVar(&a.printURL, "print-url", false, "print the link only, and open no browser")
	fs.StringVar(&a.as, "as", "", "who signs in, as the console's log of actions names it (default USER@HOST)")
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return usagef("usage: clodexctl %s", consoleUsage)
	}
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q; usage: clodexctl %s", pos[0], consoleUsage)
	}
	if a.as == "" {
		a.as = e.operator()
	}
	var resp *controlplanev1.CreateConsoleLinkResponse
	err = e.withAdmin(ctx, func(ctx context.Context, c *client) error {
		var err error
		if resp, err = c.admin.CreateConsoleLink(ctx, &controlplanev1.CreateConsoleLinkRequest{Operator: a.as}); err != nil {
			return c.rpcError(err, "", "")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if a.printURL {
		fmt.Fprintln(e.stdout, resp.GetUrl())
		return nil
	}
	exp := time.UnixMilli(resp.GetExpiresUnixMs()).Local().Format("15:04:05")
	if e.openBrowser(ctx, resp.GetUrl()) {
		fmt.Fprintf(e.stdout, "opened the console in your browser; if it did not open, follow this link before %s (it works once):\n%s\n", exp, resp.GetUrl())
		return nil
	}
	fmt.Fprintf(e.stdout, "open this link in a browser before %s (it works once):\n%s\n", exp, resp.GetUrl())
	return nil
}

// operator is USER@HOST, as the console's log names who signed in.
func (e *env) operator() string {
	name := e.getenv("USER")
	if u, err := user.Current(); name == "" && err == nil {
		name = u.Username
	}
	if name == "" {
		name = "operator"
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		name += "@" + host
	}
	if len(name) > 64 {
		name = name[:64]
	}
	return name
}

// openBrowser starts $BROWSER, or xdg-open (open on macOS), on url and
// reports whether one started. It never waits for the browser.
func (e *env) openBrowser(ctx context.Context, url string) bool {
	for _, name := range []string{e.getenv("BROWSER"), "xdg-open", "open"} {
		if name == "" {
			continue
		}
		path, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		cmd := exec.CommandContext(context.WithoutCancel(ctx), path, url) //nolint:gosec // G204: the user's own browser command
		if cmd.Start() == nil {
			_ = cmd.Process.Release() // the browser outlives clodexctl, which exits next
			return true
		}
	}
	return false
}
