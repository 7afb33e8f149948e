package main

import (
	"context"

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
	if err := e.noArgs("accounts", accountsUsage, args); err != nil {
		return err
	}
	var accts []*controlplanev1.Account
	var info *controlplanev1.StoreInfo
	err := e.withAdmin(ctx, func(ctx context.Context, c *client) error {
		var err error
		if accts, info, err = listAccounts(ctx, c); err != nil {
			return c.rpcError(err, "", "")
		}
		return nil
	})
	if err != nil {
		return err
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
