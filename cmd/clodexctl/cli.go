package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/cptarget"
	"github.com/clodex/clodex/internal/tlsconfig"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Environment variables (read only by newEnv).
const (
	envControlPlane   = "CLODEX_CONTROL_PLANE"
	envAdminToken     = "CLODEX_ADMIN_TOKEN"
	envAdminTokenFile = "CLODEX_ADMIN_TOKEN_FILE"
)

const defaultControlPlane = "127.0.0.1:17700"

// command is one subcommand.
type command struct {
	name  string
	usage string // after "clodexctl [global flags] "
	short string
	run   func(ctx context.Context, e *env, args []string) error
}

// commands lists the subcommands in help order; set in init to break the
// initialization cycle through the help command.
var commands []*command

func init() {
	commands = []*command{setRateCmd, setBudgetCmd, setAdaptiveCmd, getCmd, accountsCmd, quotaCmd, usageCmd, accountCmd, agentsCmd, agentCmd, memberCmd, topCmd, healthCmd, backupCmd, restoreCmd, consoleCmd}
}

func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

// usageError is bad input; main exits 2 for it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

func exitCode(err error) int {
	var u *usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

// globals are the flags every command accepts, before or after its name.
type globals struct {
	controlPlane string
	tokenFile    string
	output       string
	tlsCA        string
	tlsCert      string
	tlsKey       string
	timeout      time.Duration
}

// env is one invocation: its writers, environment and global flags.
type env struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
	g              globals
}

func (e *env) getenv(k string) string {
	v, _ := e.lookupEnv(k)
	return strings.TrimSpace(v)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runEnv(ctx, args, os.LookupEnv, stdout, stderr)
}

func runEnv(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	e := &env{stdout: stdout, stderr: stderr, lookupEnv: lookupEnv}
	e.g.controlPlane = e.getenv(envControlPlane)
	if e.g.controlPlane == "" {
		e.g.controlPlane = defaultControlPlane
	}
	e.g.tokenFile = e.getenv(envAdminTokenFile)
	e.g.output = "table"
	e.g.timeout = 10 * time.Second

	fs := e.flagSet("clodexctl")
	var showVersion bool
	fs.BoolVar(&showVersion, "version", false, "print the version and exit")
	// Global flags come before the command; parse up to its name.
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			e.printUsage(stdout)
			return nil
		}
		return usagef("%v (run clodexctl --help)", err)
	}
	if showVersion {
		fmt.Fprintln(stdout, "clodexctl", version)
		return nil
	}
	rest := fs.Args()
	if len(rest) == 0 {
		e.printUsage(stderr)
		return usagef("missing command; allowed: %s", commandNames())
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		e.printUsage(stdout)
		return nil
	}
	for _, c := range commands {
		if c.name == name {
			if err := c.run(ctx, e, rest); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		}
	}
	return usagef("unknown command %q; allowed: %s", name, commandNames())
}

func (e *env) printUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: clodexctl [global flags] COMMAND [args]")
	fmt.Fprintln(w, "\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %s\n      %s\n", c.usage, c.short)
	}
	fmt.Fprintln(w, "\nACCOUNT is the ChatGPT account id; clodexctl hashes it into the account key")
	fmt.Fprintln(w, "(acct_ + 16 hex digits of its SHA-256) as the data plane does. --key KEY addresses a key directly.")
	fmt.Fprintln(w, "\nGlobal flags (accepted before or after the command):")
	fs := e.flagSet("clodexctl")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintln(w, "\nFlags of account, agent and member (after the command):")
	cfs := flag.NewFlagSet("commands", flag.ContinueOnError)
	cfs.SetOutput(w)
	(&accountArgs{}).register(cfs)
	(&agentArgs{}).register(cfs)
	(&memberArgs{}).registerOwn(cfs)
	cfs.PrintDefaults()
}

// flagSet returns a FlagSet with the global flags registered into e.g.
func (e *env) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g := &e.g
	fs.StringVar(&g.controlPlane, "control-plane", g.controlPlane, "control plane `address`: host:port, or the replicas' comma-separated list a:17700,b:17700 the data planes take, or dns:///host:port (env "+envControlPlane+")")
	fs.StringVar(&g.tokenFile, "token-file", g.tokenFile, "`file` holding the admin token (env "+envAdminTokenFile+", or the token itself in "+envAdminToken+")")
	fs.StringVar(&g.output, "o", g.output, "output `format`: table or json")
	fs.StringVar(&g.tlsCA, "tls-ca", g.tlsCA, "verify the control plane with this CA PEM `file` (default plaintext)")
	fs.StringVar(&g.tlsCert, "tls-cert", g.tlsCert, "client certificate PEM `file` (with --tls-key)")
	fs.StringVar(&g.tlsKey, "tls-key", g.tlsKey, "client key PEM `file`")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "per-call `timeout`")
	return fs
}

var negativeNumber = regexp.MustCompile(`^-[0-9]`)

// parseArgs parses flags anywhere among args and returns the positional
// arguments in order. "--" ends the flags; "-1" is a positional argument,
// not a flag, unless it is the value of the flag before it.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case a == "-" || !strings.HasPrefix(a, "-") || negativeNumber.MatchString(a):
			pos = append(pos, a)
		default:
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil && !isBoolFlag(f) && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
		}
	}
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usagef("%v", err)
	}
	return pos, nil
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// checkOutput validates -o.
func (e *env) checkOutput() error {
	if e.g.output != "table" && e.g.output != "json" {
		return usagef("-o %q is invalid; allowed table, json", e.g.output)
	}
	return nil
}

// target is how a command names one account: ACCOUNT or --key KEY.
type target struct {
	key string // --key
}

func (t *target) register(fs *flag.FlagSet) {
	fs.StringVar(&t.key, "key", "", "address the account `key` (acct_ + 16 hex digits) instead of an ACCOUNT id")
}

// resolve returns the account label and key from --key or the first
// positional argument, and the remaining positional arguments.
func (t *target) resolve(pos []string) (label, key string, rest []string, err error) {
	if t.key != "" {
		if !account.IsKey(t.key) {
			return "", "", nil, usagef("--key %q is not an account key; want acct_ followed by 16 lowercase hex digits (pass the ChatGPT account id without --key to hash it)", t.key)
		}
		return t.key, t.key, pos, nil
	}
	if len(pos) == 0 || pos[0] == "" {
		return "", "", nil, usagef("missing ACCOUNT (the ChatGPT account id) or --key KEY")
	}
	return pos[0], account.Key(pos[0]), pos[1:], nil
}

// client dials the control plane with the admin token.
type client struct {
	conn  *grpc.ClientConn
	admin controlplanev1.AdminServiceClient
	addr  string
}

func (e *env) dial() (*client, error) {
	tok, err := e.token()
	if err != nil {
		return nil, err
	}
	tlsCfg, err := tlsconfig.Client(e.g.tlsCA, e.g.tlsCert, e.g.tlsKey)
	if err != nil {
		return nil, usagef("%v", err)
	}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	conn, err := e.newConn(creds,
		grpc.WithPerRPCCredentials(bearer.Credentials(tok)),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
	)
	if err != nil {
		return nil, err
	}
	return &client{conn: conn, admin: controlplanev1.NewAdminServiceClient(conn), addr: e.g.controlPlane}, nil
}

// lbConfig spreads clodexctl's calls round robin over the replicas of a
// --control-plane list (or of a name with several records): a replica
// that is down is skipped, so any one that answers serves the command.
const lbConfig = `{"loadBalancingConfig": [{"round_robin": {}}]}`

// newConn opens a connection to --control-plane, which takes what the
// data planes' --control-plane takes: host:port, a comma-separated list
// of replicas, or dns:///host:port (package cptarget).
func (e *env) newConn(creds credentials.TransportCredentials, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	t, err := cptarget.Parse(e.g.controlPlane)
	if err != nil {
		return nil, usagef("--control-plane %q: %v", e.g.controlPlane, err)
	}
	opts = append(opts, grpc.WithTransportCredentials(creds), grpc.WithDefaultServiceConfig(lbConfig))
	conn, err := grpc.NewClient(t.Target, append(opts, t.DialOptions()...)...)
	if err != nil {
		return nil, usagef("--control-plane %q: %v", e.g.controlPlane, err)
	}
	return conn, nil
}

func (c *client) Close() { _ = c.conn.Close() }

// token reads the admin token: --token-file (or CLODEX_ADMIN_TOKEN_FILE),
// else CLODEX_ADMIN_TOKEN.
func (e *env) token() (bearer.Token, error) {
	if e.g.tokenFile != "" {
		tok, warn, err := bearer.ReadFile(e.g.tokenFile)
		if err != nil {
			return bearer.Token{}, err
		}
		if warn != "" {
			fmt.Fprintln(e.stderr, "clodexctl: warning:", warn)
		}
		return tok, nil
	}
	if v := e.getenv(envAdminToken); v != "" {
		return bearer.Parse(v)
	}
	return bearer.Token{}, usagef("no admin token; pass --token-file FILE or set %s", envAdminToken)
}

// parse parses a command's arguments with its flags fs, answering -h
// with usage, and checks -o; it returns the positional arguments.
func (e *env) parse(fs *flag.FlagSet, usage string, args []string) ([]string, error) {
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil, usagef("usage: clodexctl %s", usage)
	}
	if err != nil {
		return nil, err
	}
	if err := e.checkOutput(); err != nil {
		return nil, err
	}
	return pos, nil
}

// parseTarget parses the arguments of a command name whose only flags
// are an account's (ACCOUNT or --key KEY, as target takes them) and
// resolves the account: its label and key, and the arguments after it.
func (e *env) parseTarget(name, usage string, args []string) (label, key string, rest []string, err error) {
	var t target
	fs := e.flagSet(name)
	t.register(fs)
	pos, err := e.parse(fs, usage, args)
	if err != nil {
		return "", "", nil, err
	}
	return t.resolve(pos)
}

// noArgs parses the arguments of a command (or subcommand) name that
// takes no flag of its own and no argument, as usage shows it, and checks
// -o.
func (e *env) noArgs(name, usage string, args []string) error {
	pos, err := e.parse(e.flagSet(name), usage, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q; %s takes no arguments", pos[0], name)
	}
	return nil
}

// callCtx bounds one RPC by --timeout.
func (e *env) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.g.timeout)
}

// rpcError turns an RPC failure into one line for the operator.
func (c *client) rpcError(err error, label, key string) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.NotFound:
		return fmt.Errorf("account %s is unknown to the control plane (key %s): it has no stored policy and no recent admissions; clodexctl accounts lists known keys", label, key)
	case codes.InvalidArgument:
		return usagef("%s", st.Message())
	case codes.Unauthenticated:
		return fmt.Errorf("the control plane at %s refused the token (Unauthenticated); check --token-file or %s", c.addr, envAdminToken)
	case codes.PermissionDenied:
		return fmt.Errorf("the control plane at %s denied the call (PermissionDenied): the token is not the admin token", c.addr)
	case codes.Unavailable:
		return fmt.Errorf("the control plane at %s is unavailable: %s", c.addr, st.Message())
	case codes.FailedPrecondition:
		return fmt.Errorf("the control plane at %s could not do it: %s", c.addr, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("no answer from the control plane at %s in time (--timeout)", c.addr)
	}
	return fmt.Errorf("%s: %s", st.Code(), st.Message())
}
