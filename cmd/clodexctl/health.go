package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clodex/clodex/internal/tlsconfig"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const healthUsage = "health [URL]"

var healthCmd = &command{
	name:  "health",
	usage: healthUsage,
	short: "exit 0 when the control plane's gRPC health is SERVING, or when URL (e.g. a data plane's /healthz) answers 200; for probes",
	run:   runHealth,
}

type healthArgs struct{}

// runHealth checks the control plane's grpc.health.v1 service (no token
// needed), or GETs an http:// URL. It prints one line and exits 1 when
// unhealthy, so container and systemd health checks can run it without a
// shell.
func runHealth(ctx context.Context, e *env, args []string) error {
	var _ healthArgs
	fs := e.flagSet("health")
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return usagef("usage: clodexctl %s", healthUsage)
	}
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usagef("unexpected argument %q; usage: clodexctl %s", pos[1], healthUsage)
	}
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	if len(pos) == 1 {
		return e.httpHealth(cctx, pos[0])
	}
	tlsCfg, err := tlsconfig.Client(e.g.tlsCA, e.g.tlsCert, e.g.tlsKey)
	if err != nil {
		return usagef("%v", err)
	}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	conn, err := grpc.NewClient(e.g.controlPlane, grpc.WithTransportCredentials(creds))
	if err != nil {
		return usagef("--control-plane %q: %v", e.g.controlPlane, err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		c := &client{addr: e.g.controlPlane}
		return c.rpcError(err, "", "")
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("the control plane at %s is %s", e.g.controlPlane, resp.GetStatus())
	}
	fmt.Fprintf(e.stdout, "%s SERVING\n", e.g.controlPlane)
	// The store: its health needs no token; with the admin token, what
	// it lost and restored too. Neither changes the exit status: the
	// control plane serves either way.
	if st, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: storeHealthService}); err == nil && st.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		fmt.Fprintf(e.stdout, "store %s: it cannot be reached; this replica admits from its share of each policy\n", st.GetStatus())
	}
	if line := e.storeLine(cctx); line != "" {
		fmt.Fprintln(e.stdout, "store:", line)
	}
	return nil
}

// storeHealthService is controlplane.StoreHealthService (clodexctl does
// not import the server).
const storeHealthService = "clodex.controlplane.v1.Store"

// storeLine describes the store's losses and restores when an admin
// token is at hand ("" otherwise, or when there is nothing to say).
func (e *env) storeLine(ctx context.Context) string {
	if _, err := e.token(); err != nil {
		return ""
	}
	c, err := e.dial()
	if err != nil {
		return ""
	}
	defer c.Close()
	resp, err := c.admin.ListAccounts(ctx, &controlplanev1.ListAccountsRequest{PageSize: 1})
	if err != nil {
		return ""
	}
	return storeOf(resp.GetStore()).History()
}

func (e *env) httpHealth(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("URL %q is not an http:// or https:// URL with a host", raw)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return usagef("URL %q: %v", raw, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)
	}
	fmt.Fprintf(e.stdout, "%s %s\n", u.Redacted(), resp.Status)
	return nil
}
