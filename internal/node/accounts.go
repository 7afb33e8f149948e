package node

import (
	"context"
	"fmt"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
)

// fileAccounts serves several auth.json files (--codex-auth repeated),
// each its own ChatGPT account refreshed under its own file lock. It is
// the gateway's gateway.AccountCredentials; Credential and Rejected serve
// the first file, for callers that name no account.
type fileAccounts struct {
	order []string // account ids, in flag order
	byID  map[string]*credentials.RefreshingFile
}

// newFileAccounts reads each file's account id. Two files of the same
// account, or a file without an account id, are configuration errors.
func newFileAccounts(ctx context.Context, paths []string, files []*credentials.RefreshingFile) (*fileAccounts, error) {
	fa := &fileAccounts{byID: make(map[string]*credentials.RefreshingFile, len(files))}
	seen := map[string]string{}
	for i, f := range files {
		cred, err := f.Credential(ctx)
		if err != nil {
			return nil, fmt.Errorf("--codex-auth %s: %w", paths[i], err)
		}
		if cred.AccountID == "" {
			return nil, fmt.Errorf("--codex-auth %s has no account id (tokens.account_id); with several --codex-auth files each must name its ChatGPT account", paths[i])
		}
		if prev, dup := seen[cred.AccountID]; dup {
			return nil, fmt.Errorf("--codex-auth %s and %s hold the same account %s; give each account once", prev, paths[i], account.Key(cred.AccountID))
		}
		seen[cred.AccountID] = paths[i]
		fa.order = append(fa.order, cred.AccountID)
		fa.byID[cred.AccountID] = f
	}
	return fa, nil
}

func (fa *fileAccounts) Credential(ctx context.Context) (codexauth.Credential, error) {
	return fa.byID[fa.order[0]].Credential(ctx)
}

func (fa *fileAccounts) Rejected(ctx context.Context, token codexauth.Secret) (codexauth.Credential, error) {
	return fa.byID[fa.order[0]].Rejected(ctx, token)
}

func (fa *fileAccounts) file(accountID string) (*credentials.RefreshingFile, error) {
	f, ok := fa.byID[accountID]
	if !ok {
		return nil, fmt.Errorf("account %s is not served by any --codex-auth file", account.Key(accountID))
	}
	return f, nil
}

func (fa *fileAccounts) CredentialFor(ctx context.Context, accountID string) (codexauth.Credential, error) {
	f, err := fa.file(accountID)
	if err != nil {
		return codexauth.Credential{}, err
	}
	return f.Credential(ctx)
}

func (fa *fileAccounts) RejectedFor(ctx context.Context, accountID string, token codexauth.Secret) (codexauth.Credential, error) {
	f, err := fa.file(accountID)
	if err != nil {
		return codexauth.Credential{}, err
	}
	return f.Rejected(ctx, token)
}
