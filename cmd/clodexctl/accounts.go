package main

import (
	"context"
	"errors"
	"flag"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const accountsUsage = "accounts"

var accountsCmd = &command{
	name:  "accounts",
	usage: accountsUsage,
	short: "list every known account key and the store that serves them",
	run:   runAccounts,
}

type accountsArgs struct{}

func runAccounts(ctx context.Context, e *env, args []string) error {
	var _ accountsArgs
	fs := e.flagSet("accounts")
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return usagef("usage: clodexctl %s", accountsUsage)
	}
	if err != nil {
		return err
	}
	if err := e.checkOutput(); err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q; accounts takes no arguments", pos[0])
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	accts, info, err := listAccounts(cctx, c)
	if err != nil {
		return c.rpcError(err, "", "")
	}
	store := storeOf(info)
	views := make([]accountView, 0, len(accts))
	for _, a := range accts {
		v := view("", a)
		v.Store = store
		views = append(views, v)
	}
	if e.g.output == "json" {
		return writeJSON(e.stdout, views)
	}
	return writeAccounts(e.stdout, views, store)
}

// listAccounts reads every page of ListAccounts; the store is the one
// that served the last page.
func listAccounts(ctx context.Context, c *client) ([]*controlplanev1.Account, *controlplanev1.StoreInfo, error) {
	var st *controlplanev1.StoreInfo
	out, err := readPages(func(token string) ([]*controlplanev1.Account, string, error) {
		resp, err := c.admin.ListAccounts(ctx, &controlplanev1.ListAccountsRequest{PageToken: token})
		st = resp.GetStore()
		return resp.GetAccounts(), resp.GetNextPageToken(), err
	})
	if err != nil {
		return nil, nil, err
	}
	return out, st, nil
}
