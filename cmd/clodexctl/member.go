package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/atomicfile"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const memberUsage = "member create NAME [--accounts ACCOUNT[,ACCOUNT...]] [--pin ACCOUNT] [--rate N] --out FILE | list | remove NAME"

var memberCmd = &command{
	name:  "member",
	usage: memberUsage,
	short: "manage the team's members: a key of their own for a data plane started with --member-keys, the accounts they may use, a pin and a cap of new connections a minute",
	run:   runMemberCmd,
}

// memberKeyPrefix starts every member key, so a key found in a file or a
// shell history says what it is.
const memberKeyPrefix = "clx_"

// newMemberKey draws a member key: the prefix and 32 random bytes in
// base64url (43 characters).
func newMemberKey() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return memberKeyPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

type memberArgs struct {
	accounts string
	pin      string
	rate     string
	out      string
}

// register adds the member command's own flags to fs.
func (a *memberArgs) register(fs *flag.FlagSet) {
	fs.StringVar(&a.accounts, "accounts", "", "member create: the `ACCOUNTS` the member may use, comma-separated ChatGPT account ids or keys (default every account)")
	a.registerOwn(fs)
	fs.StringVar(&a.out, "out", "", "member create: write the member's new key to this `file` (mode 0600; it must not exist)")
}

// registerOwn adds the flags only the member command has (the usage lists
// --accounts and --out with the agent command's).
func (a *memberArgs) registerOwn(fs *flag.FlagSet) {
	fs.StringVar(&a.pin, "pin", "", "member create: the `ACCOUNT` (id or key) every turn of the member runs on, one of --accounts")
	fs.StringVar(&a.rate, "rate", "", "member create: the member's cap, `N` new upstream connections a minute (burst N) on every account, 0..600 (default none)")
}

// memberView is a member as clodexctl prints it; scripts rely on the JSON
// keys.
type memberView struct {
	Name          string   `json:"name"`
	Accounts      []string `json:"accounts"`
	Pin           string   `json:"pin,omitempty"`
	RatePerMinute int32    `json:"rate_per_minute"`
	Created       string   `json:"created"`
	Out           string   `json:"key_file,omitempty"`
	// Unreadable says the stored member does not decode; the control
	// plane keeps pushing the copy it loaded before.
	Unreadable string `json:"unreadable,omitempty"`
}

func memberViewOf(m *controlplanev1.Member) memberView {
	accts := m.GetAccounts()
	if accts == nil {
		accts = []string{}
	}
	return memberView{Name: m.GetName(), Accounts: accts, Pin: m.GetPin(), RatePerMinute: m.GetRatePerMinute(),
		Created: rfc3339(m.GetCreatedUnixMs()), Unreadable: m.GetUnreadable()}
}

func runMemberCmd(ctx context.Context, e *env, args []string) error {
	var a memberArgs
	fs := e.flagSet("member")
	a.register(fs)
	pos, err := e.parse(fs, memberUsage, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("missing subcommand; usage: clodexctl %s", memberUsage)
	}
	switch sub, pos := pos[0], pos[1:]; sub {
	case "create":
		if len(pos) != 1 {
			return usagef("member create takes one NAME; usage: clodexctl %s", memberUsage)
		}
		if a.out == "" {
			return usagef("member create needs --out FILE, where the member's key is written")
		}
		return e.memberCreate(ctx, pos[0], a)
	case "list":
		if len(pos) > 0 {
			return usagef("unexpected argument %q; member list takes no arguments", pos[0])
		}
		return e.memberList(ctx)
	case "remove":
		if len(pos) != 1 {
			return usagef("member remove takes one NAME")
		}
		return e.memberRemove(ctx, pos[0])
	default:
		return usagef("unknown member subcommand %q; allowed: create, list, remove", sub)
	}
}

// memberRequest turns member create's arguments into its request (without
// the key's digest); labels maps each key hashed from an account id back
// to the id, for messages.
func memberRequest(name string, a memberArgs) (*controlplanev1.CreateMemberRequest, map[string]string, error) {
	req := &controlplanev1.CreateMemberRequest{Name: name}
	labels := map[string]string{}
	if a.accounts != "" {
		keys, l, err := agentKeys(a.accounts)
		if err != nil {
			return nil, nil, err
		}
		req.Accounts, labels = keys, l
	}
	if a.pin != "" {
		req.Pin = a.pin
		if !account.IsKey(a.pin) {
			req.Pin = account.Key(a.pin)
			labels[req.Pin] = a.pin
		}
	}
	if a.rate != "" {
		n, err := strconv.ParseInt(a.rate, 10, 32)
		if err != nil || pacing.ValidateRate(int(n)) != nil {
			return nil, nil, usagef("--rate %q is invalid; want a whole number of new connections a minute, 0..600 (0: no cap)", a.rate)
		}
		req.RatePerMinute = int32(n)
	}
	return req, labels, nil
}

// memberCreate draws a new key, writes it to a.out (atomically, 0600) and
// registers its digest; the key never leaves this machine otherwise.
func (e *env) memberCreate(ctx context.Context, name string, a memberArgs) error {
	req, labels, err := memberRequest(name, a)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(a.out); err == nil {
		return usagef("--out %s exists; remove it or choose another file (a key file is never overwritten)", a.out)
	}
	key := newMemberKey()
	if err := atomicfile.WriteFile(a.out, []byte(key+"\n"), 0o600); err != nil {
		return fmt.Errorf("write --out: %w", err)
	}
	sum := sha256.Sum256([]byte(key))
	req.KeySha256 = sum[:]
	var resp *controlplanev1.CreateMemberResponse
	err = e.withAdmin(ctx, func(ctx context.Context, c *client) (err error) {
		resp, err = c.admin.CreateMember(ctx, req)
		if status.Code(err) == codes.InvalidArgument {
			return usagef("%s", named(status.Convert(err).Message(), labels))
		}
		return c.memberError(err, name)
	})
	if err != nil {
		_ = os.Remove(a.out)
		return err
	}
	v := memberViewOf(resp.GetMember())
	v.Out = a.out
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "member %s created (%s); their key is in %s: give it to %s, who sends it as ANTHROPIC_API_KEY to a data plane started with --member-keys (or runs clodex-dataplane claude --member-key-file FILE)\n",
		v.Name, memberTerms(v), a.out, v.Name)
	return nil
}

// memberTerms says what a member may use: "every account, no pin, no
// cap".
func memberTerms(v memberView) string {
	accts := "every account"
	if len(v.Accounts) > 0 {
		accts = "accounts " + strings.Join(v.Accounts, ",")
	}
	pin := "no pin"
	if v.Pin != "" {
		pin = "pinned to " + v.Pin
	}
	limit := "no cap"
	if v.RatePerMinute > 0 {
		limit = fmt.Sprintf("a cap of %d new connections a minute", v.RatePerMinute)
	}
	return accts + ", " + pin + ", " + limit
}

func (e *env) memberList(ctx context.Context) error {
	return listAll(ctx, e, func(ctx context.Context, c *client, token string) ([]*controlplanev1.Member, string, error) {
		resp, err := c.admin.ListMembers(ctx, &controlplanev1.ListMembersRequest{PageToken: token})
		return resp.GetMembers(), resp.GetNextPageToken(), err
	}, func(c *client, err error) error { return c.memberError(err, "") }, memberViewOf, writeMembers)
}

func (e *env) memberRemove(ctx context.Context, name string) error {
	err := e.withAdmin(ctx, func(ctx context.Context, c *client) error {
		_, err := c.admin.RemoveMember(ctx, &controlplanev1.RemoveMemberRequest{Name: name})
		return c.memberError(err, name)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "member %s removed; every data plane refuses their key within seconds\n", name)
	return nil
}

// memberError turns a member RPC's failure into one line; nil stays nil.
func (c *client) memberError(err error, name string) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.OK:
		return nil
	case codes.NotFound:
		return fmt.Errorf("the control plane has no member named %s; clodexctl member list shows them", name)
	case codes.InvalidArgument:
		return usagef("%s", st.Message())
	case codes.ResourceExhausted, codes.FailedPrecondition:
		return fmt.Errorf("the control plane at %s could not do it: %s", c.addr, st.Message())
	}
	return c.rpcError(err, name, "")
}

func writeMembers(w io.Writer, vs []memberView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED\tRATE\tPIN\tACCOUNTS")
	for _, v := range vs {
		created := v.Created
		if v.Unreadable != "" {
			created = "UNREADABLE"
		}
		rate, pin, accts := "-", "-", "all"
		if v.RatePerMinute > 0 {
			rate = fmt.Sprintf("%d/min", v.RatePerMinute)
		}
		if v.Pin != "" {
			pin = v.Pin
		}
		if len(v.Accounts) > 0 {
			accts = strings.Join(v.Accounts, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.Name, created, rate, pin, accts)
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
