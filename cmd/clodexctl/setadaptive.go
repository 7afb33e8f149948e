package main

import (
	"context"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const setAdaptiveUsage = "set-adaptive ACCOUNT on|off | set-adaptive --key KEY on|off"

var setAdaptiveCmd = &command{
	name:  "set-adaptive",
	usage: setAdaptiveUsage,
	short: "turn adaptive mode (on by default) on or off: an upstream 403 pauses new sockets and halves the effective rate, quiet 30 s steps raise it back",
	run:   runSetAdaptive,
}

func runSetAdaptive(ctx context.Context, e *env, args []string) error {
	label, key, rest, err := e.parseTarget("set-adaptive", setAdaptiveUsage, args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return usagef("missing on|off; usage: clodexctl %s", setAdaptiveUsage)
	}
	if len(rest) > 1 {
		return usagef("unexpected argument %q; usage: clodexctl %s", rest[1], setAdaptiveUsage)
	}
	var enabled bool
	switch rest[0] {
	case "on":
		enabled = true
	case "off":
	default:
		return usagef("adaptive mode %q is invalid; allowed on, off", rest[0])
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	resp, err := c.admin.SetAdaptive(cctx, &controlplanev1.SetAdaptiveRequest{Key: key, Enabled: enabled})
	if err != nil {
		return c.rpcError(err, label, key)
	}
	return e.printAccount(view(label, resp.GetAccount()))
}
