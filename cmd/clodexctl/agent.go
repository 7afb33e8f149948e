package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/atomicfile"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const agentUsage = "agent create NAME --accounts ACCOUNT[,ACCOUNT...] --out FILE | list | remove NAME"

var agentCmd = &command{
	name:  "agent",
	usage: agentUsage,
	short: "manage scoped agent credentials: tokens a data plane passes as --agent-token-file that reach only the accounts named",
	run:   runAgentCmd,
}

type agentArgs struct {
	accounts string
	out      string
}

// agentCredView is a scoped agent credential as clodexctl prints it.
type agentCredView struct {
	Name     string   `json:"name"`
	Accounts []string `json:"accounts"`
	Created  string   `json:"created"`
	Out      string   `json:"token_file,omitempty"`
	// Unreadable says the stored credential does not decode; the control
	// plane keeps enforcing the copy it loaded before.
	Unreadable string `json:"unreadable,omitempty"`
}

func agentCredViewOf(c *controlplanev1.AgentCredential) agentCredView {
	accts := c.GetAccounts()
	if accts == nil {
		accts = []string{}
	}
	return agentCredView{Name: c.GetName(), Accounts: accts, Created: rfc3339(c.GetCreatedUnixMs()), Unreadable: c.GetUnreadable()}
}

// register adds the agent command's own flags to fs.
func (a *agentArgs) register(fs *flag.FlagSet) {
	fs.StringVar(&a.accounts, "accounts", "", "agent create, member create: the `ACCOUNTS` the agent (member) may use, comma-separated ChatGPT account ids or keys")
	fs.StringVar(&a.out, "out", "", "agent create, member create: write the new agent token (member key) to this `file` (mode 0600; it must not exist)")
}

func runAgentCmd(ctx context.Context, e *env, args []string) error {
	var a agentArgs
	fs := e.flagSet("agent")
	a.register(fs)
	pos, err := e.parse(fs, agentUsage, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; usage: clodexctl %s", agentUsage)
	}
	switch sub, pos := pos[0], pos[1:]; sub {
	case "create":
		if len(pos) != 1 {
			return usagef("agent create takes one NAME; usage: clodexctl %s", agentUsage)
		}
		if a.accounts == "" || a.out == "" {
			return usagef("agent create needs --accounts ACCOUNT[,ACCOUNT...] and --out FILE")
		}
		return e.agentCreate(ctx, pos[0], a.accounts, a.out)
	case "list":
		if len(pos) > 0 {
			return usagef("unexpected argument %q; agent list takes no arguments", pos[0])
		}
		return e.agentList(ctx)
	case "remove":
		if len(pos) != 1 {
			return usagef("agent remove takes one NAME")
		}
		return e.agentRemove(ctx, pos[0])
	default:
		return usagef("unknown agent subcommand %q; allowed: create, list, remove", sub)
	}
}

// agentKeys turns --accounts into account keys: a key stays as it is, an
// account id is hashed. labels maps each key hashed from an id back to
// the id, for messages.
func agentKeys(list string) (keys []string, labels map[string]string, err error) {
	labels = map[string]string{}
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, nil, usagef("--accounts %q has an empty entry; want comma-separated ChatGPT account ids or keys", list)
		}
		if account.IsKey(a) {
			keys = append(keys, a)
		} else {
			k := account.Key(a)
			keys = append(keys, k)
			labels[k] = a
		}
	}
	return keys, labels, nil
}

// named writes the account id beside each key msg names, as the operator
// typed it in --accounts.
func named(msg string, labels map[string]string) string {
	for k, id := range labels {
		msg = strings.ReplaceAll(msg, k, fmt.Sprintf("%s (key %s)", id, k))
	}
	return msg
}

// agentCreate draws a new token, writes it to out (atomically, 0600) and
// registers its digest; the token never leaves this machine otherwise.
func (e *env) agentCreate(ctx context.Context, name, accounts, out string) error {
	keys, labels, err := agentKeys(accounts)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(out); err == nil {
		return usagef("--out %s exists; remove it or choose another file (a token file is never overwritten)", out)
	}
	tok := rand.Text()
	if err := atomicfile.WriteFile(out, []byte(tok+"\n"), 0o600); err != nil {
		return fmt.Errorf("write --out: %w", err)
	}
	sum := sha256.Sum256([]byte(tok))
	var resp *controlplanev1.CreateAgentCredentialResponse
	brokerless := false
	err = e.withAdmin(ctx, func(ctx context.Context, c *client) (err error) {
		resp, err = c.admin.CreateAgentCredential(ctx, &controlplanev1.CreateAgentCredentialRequest{Name: name, Accounts: keys, TokenSha256: sum[:]})
		if status.Code(err) == codes.FailedPrecondition {
			return errors.New(named(status.Convert(err).Message(), labels))
		}
		if err != nil {
			return c.loginError(err, name, "")
		}
		// A control plane without a broker cannot tell whether the
		// accounts are signed in anywhere: say what the token needs then.
		_, lerr := c.admin.ListLogins(ctx, &controlplanev1.ListLoginsRequest{PageSize: 1})
		brokerless = status.Code(lerr) == codes.FailedPrecondition
		return nil
	})
	if err != nil {
		_ = os.Remove(out)
		return err
	}
	if brokerless {
		fmt.Fprintln(e.stderr, "clodexctl: note: this control plane runs no credential broker (no --credential-key-file), so it hands out no sign-ins: a data plane given this token serves these accounts only from its own --codex-auth files")
	}
	v := agentCredViewOf(resp.GetCredential())
	v.Out = out
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "agent credential %s created for %s; its token is in %s (pass it to clodex-dataplane as --agent-token-file)\n",
		v.Name, strings.Join(v.Accounts, ","), out)
	return nil
}

func (e *env) agentList(ctx context.Context) error {
	return listAll(ctx, e, func(ctx context.Context, c *client, token string) ([]*controlplanev1.AgentCredential, string, error) {
		resp, err := c.admin.ListAgentCredentials(ctx, &controlplanev1.ListAgentCredentialsRequest{PageToken: token})
		return resp.GetCredentials(), resp.GetNextPageToken(), err
	}, func(c *client, err error) error { return c.loginError(err, "", "") }, agentCredViewOf, writeAgentCreds)
}

func (e *env) agentRemove(ctx context.Context, name string) error {
	err := e.withAdmin(ctx, func(ctx context.Context, c *client) error {
		_, err := c.admin.RemoveAgentCredential(ctx, &controlplanev1.RemoveAgentCredentialRequest{Name: name})
		if status.Code(err) == codes.NotFound {
			return fmt.Errorf("the control plane has no agent credential named %s; clodexctl agent list shows them", name)
		}
		return c.loginError(err, name, "")
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "agent credential %s removed; its token is refused from now on\n", name)
	return nil
}

func writeAgentCreds(w io.Writer, vs []agentCredView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED\tACCOUNTS")
	for _, v := range vs {
		created := v.Created
		if v.Unreadable != "" {
			created = "UNREADABLE"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.Name, created, strings.Join(v.Accounts, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range vs {
		if v.Unreadable != "" {
			fmt.Fprintf(w, "unreadable: %s: %s\n", v.Name, v.Unreadable)
		}
	}
	return nil
}
