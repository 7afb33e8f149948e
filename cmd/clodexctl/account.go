package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/codexauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const accountUsage = "account import --codex-auth FILE | login [--issuer URL] | list | show ACCOUNT | remove ACCOUNT"

var accountCmd = &command{
	name:  "account",
	usage: accountUsage,
	short: "manage the sign-ins the control plane's credential broker holds (ACCOUNT or --key KEY)",
	run:   runAccount,
}

type accountArgs struct {
	codexAuth     string
	issuer        string
	tokenEndpoint string
	target        target
}

// loginView is a sign-in as clodexctl prints it; scripts rely on the JSON
// keys. Times are RFC 3339 in UTC, empty when unknown.
type loginView struct {
	Key        string `json:"key"`
	AccountID  string `json:"account_id"`
	State      string `json:"state"` // ok, needs-login or unreadable
	NeedsLogin string `json:"needs_login,omitempty"`
	Unreadable string `json:"unreadable,omitempty"`
	ExpiresAt  string `json:"expires_at,omitempty"`
	// UpdatedAt is when the tokens were last written; UpdatedBy says by
	// what: "sign-in" (an import or login: no refresh since) or
	// "refresh" (the broker's last refresh).
	UpdatedAt string `json:"updated_at,omitempty"`
	UpdatedBy string `json:"updated_by,omitempty"`
	Refreshes int64  `json:"refreshes"`
}

func loginViewOf(l *controlplanev1.Login) loginView {
	v := loginView{Key: l.GetKey(), AccountID: l.GetAccountId(), State: "ok", NeedsLogin: l.GetNeedsLogin(), Refreshes: l.GetRefreshes(),
		Unreadable: l.GetUnreadable()}
	switch {
	case v.Unreadable != "":
		v.State = "unreadable"
	case v.NeedsLogin != "":
		v.State = "needs-login"
	}
	if ms := l.GetExpiresAtUnixMs(); ms != 0 {
		v.ExpiresAt = rfc3339(ms)
	}
	if ms := l.GetRefreshedAtUnixMs(); ms != 0 {
		// The store keeps one time, of the last write: the sign-in until
		// the first refresh, then the latest refresh.
		v.UpdatedAt, v.UpdatedBy = rfc3339(ms), "sign-in"
		if v.Refreshes > 0 {
			v.UpdatedBy = "refresh"
		}
	}
	return v
}

// register adds the account command's own flags to fs.
func (a *accountArgs) register(fs *flag.FlagSet) {
	fs.StringVar(&a.codexAuth, "codex-auth", "", "account import: the Codex auth.json `file` to import")
	fs.StringVar(&a.issuer, "issuer", codexauth.DefaultIssuer, "account login: the identity provider's `URL`")
	fs.StringVar(&a.tokenEndpoint, "token-endpoint", "", "account login: the OAuth token `URL` (default ISSUER/oauth/token)")
	a.target.register(fs)
}

func runAccount(ctx context.Context, e *env, args []string) error {
	var a accountArgs
	fs := e.flagSet("account")
	a.register(fs)
	pos, err := e.parse(fs, accountUsage, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; usage: clodexctl %s", accountUsage)
	}
	sub, pos := pos[0], pos[1:]
	switch sub {
	case "import":
		if a.codexAuth == "" {
			return usagef("account import needs --codex-auth FILE (a Codex auth.json, e.g. ~/.codex/auth.json)")
		}
		if len(pos) > 0 {
			return usagef("unexpected argument %q; account import takes only --codex-auth FILE", pos[0])
		}
		return e.accountImport(ctx, a.codexAuth)
	case "login":
		if len(pos) > 0 {
			return usagef("unexpected argument %q; account login takes only --issuer URL", pos[0])
		}
		return e.accountLogin(ctx, a.issuer, a.tokenEndpoint)
	case "list":
		if len(pos) > 0 {
			return usagef("unexpected argument %q; account list takes no arguments", pos[0])
		}
		return e.accountList(ctx)
	case "show", "remove":
		label, key, rest, err := a.target.resolve(pos)
		if err != nil {
			return err
		}
		if len(rest) > 0 {
			return usagef("unexpected argument %q; account %s takes one ACCOUNT or --key KEY", rest[0], sub)
		}
		if sub == "show" {
			return e.accountShow(ctx, label, key)
		}
		return e.accountRemove(ctx, label, key)
	}
	return usagef("unknown account subcommand %q; allowed: import, login, list, show, remove", sub)
}

// accountImport sends the tokens of a Codex auth.json to the broker.
func (e *env) accountImport(ctx context.Context, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read --codex-auth: %w", err)
	}
	f, err := codexauth.ParseAuthFile(path, data)
	if err != nil {
		return err
	}
	if f.Tokens.RefreshToken == "" {
		return fmt.Errorf("codex auth file %s: tokens.refresh_token is missing or empty; the broker must be able to refresh the sign-in (run `codex login` again)", path)
	}
	return e.importLogin(ctx, &controlplanev1.ImportLoginRequest{
		AccessToken:  f.Tokens.AccessToken.Reveal(),
		RefreshToken: f.Tokens.RefreshToken.Reveal(),
		IdToken:      f.Tokens.IDToken.Reveal(),
		AccountId:    f.Tokens.AccountID,
	}, "imported from "+path)
}

// accountLogin runs the device-code login against issuer here, then hands
// the tokens to the broker: the control plane never needs to reach the
// operator's browser.
func (e *env) accountLogin(ctx context.Context, issuer, tokenEndpoint string) error {
	if tokenEndpoint == "" {
		tokenEndpoint = strings.TrimRight(issuer, "/") + "/oauth/token"
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	dc, err := codexauth.StartDeviceLogin(ctx, hc, issuer, codexauth.DefaultClientID, time.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "To sign in, open %s and enter the code %s (it expires at %s).\nWaiting for the sign-in...\n",
		dc.VerificationURL, dc.UserCode, dc.ExpiresAt.UTC().Format(time.RFC3339))
	lctx, cancel := context.WithDeadline(ctx, dc.ExpiresAt)
	defer cancel()
	tr, err := codexauth.PollDeviceLogin(lctx, hc, dc, tokenEndpoint, codexauth.DefaultClientID, sleepCtx)
	if err != nil {
		return err
	}
	return e.importLogin(ctx, &controlplanev1.ImportLoginRequest{
		AccessToken:  tr.AccessToken.Reveal(),
		RefreshToken: tr.RefreshToken.Reveal(),
		IdToken:      tr.IDToken.Reveal(),
	}, "signed in at "+issuer)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (e *env) importLogin(ctx context.Context, req *controlplanev1.ImportLoginRequest, what string) error {
	var resp *controlplanev1.ImportLoginResponse
	err := e.withAdmin(ctx, func(ctx context.Context, c *client) (err error) {
		resp, err = c.admin.ImportLogin(ctx, req)
		return c.loginError(err, "", "")
	})
	if err != nil {
		return err
	}
	v := loginViewOf(resp.GetLogin())
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "account %s (key %s) %s; the control plane now refreshes it\n", v.AccountID, v.Key, what)
	return nil
}

func (e *env) accountList(ctx context.Context) error {
	return listAll(ctx, e, func(ctx context.Context, c *client, token string) ([]*controlplanev1.Login, string, error) {
		resp, err := c.admin.ListLogins(ctx, &controlplanev1.ListLoginsRequest{PageToken: token})
		return resp.GetLogins(), resp.GetNextPageToken(), err
	}, func(c *client, err error) error { return c.loginError(err, "", "") }, loginViewOf, writeLogins)
}

func (e *env) accountShow(ctx context.Context, label, key string) error {
	var resp *controlplanev1.GetLoginResponse
	err := e.withAdmin(ctx, func(ctx context.Context, c *client) (err error) {
		resp, err = c.admin.GetLogin(ctx, &controlplanev1.GetLoginRequest{Key: key})
		return c.loginError(err, label, key)
	})
	if err != nil {
		return err
	}
	v := loginViewOf(resp.GetLogin())
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	return writeLogins(e.stdout, []loginView{v})
}

func (e *env) accountRemove(ctx context.Context, label, key string) error {
	err := e.withAdmin(ctx, func(ctx context.Context, c *client) error {
		_, err := c.admin.RemoveLogin(ctx, &controlplanev1.RemoveLoginRequest{Key: key})
		return c.loginError(err, label, key)
	})
	if err != nil {
		return err
	}
	if e.g.output == "json" {
		return writeJSON(e.stdout, map[string]string{"key": key, "removed": "true"})
	}
	fmt.Fprintf(e.stdout, "removed the sign-in of %s (key %s)\n", label, key)
	return nil
}

// withAdmin dials the control plane with the admin token and runs fn
// under --timeout.
func (e *env) withAdmin(ctx context.Context, fn func(ctx context.Context, c *client) error) error {
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	return fn(cctx, c)
}

// loginError turns a broker RPC failure into one line; nil stays nil.
func (c *client) loginError(err error, label, key string) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.NotFound:
		return fmt.Errorf("the control plane holds no sign-in for %s (key %s); clodexctl account list shows the ones it holds", label, key)
	case codes.FailedPrecondition:
		return errors.New(st.Message())
	}
	return c.rpcError(err, label, key)
}

// writeLogins prints sign-ins as a table, one per row.
func writeLogins(w io.Writer, vs []loginView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tACCOUNT ID\tSTATE\tEXPIRES\tUPDATED\tREFRESHES")
	for _, v := range vs {
		state := v.State
		if v.NeedsLogin != "" {
			state += " (" + v.NeedsLogin + ")"
		}
		updated := dash(v.UpdatedAt)
		if v.UpdatedBy != "" {
			updated += " (" + v.UpdatedBy + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", v.Key, dash(v.AccountID), state, dash(v.ExpiresAt), updated, v.Refreshes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range vs {
		if v.NeedsLogin != "" {
			fmt.Fprintln(w, "\nAn account in state needs-login can no longer be refreshed: run `clodexctl account login` (or `clodexctl account import --codex-auth FILE`) for it.")
			break
		}
	}
	for _, v := range vs {
		if v.Unreadable != "" {
			fmt.Fprintf(w, "unreadable: %s: %s; import or log the account in again, or restore a backup\n", v.Key, v.Unreadable)
		}
	}
	return nil
}
