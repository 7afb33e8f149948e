package main

import (
	"context"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const getUsage = "get ACCOUNT | get --key KEY"

var getCmd = &command{
	name:  "get",
	usage: getUsage,
	short: "show one account's policy and bucket",
	run:   runGet,
}

func runGet(ctx context.Context, e *env, args []string) error {
	label, key, rest, err := e.parseTarget("get", getUsage, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("unexpected argument %q; usage: clodexctl %s", rest[0], getUsage)
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	resp, err := c.admin.GetAccount(cctx, &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		return c.rpcError(err, label, key)
	}
	v := view(label, resp.GetAccount())
	v.Store = storeOf(resp.GetStore())
	return e.printAccount(v)
}
