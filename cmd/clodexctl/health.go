package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clodex/clodex/internal/tlsconfig"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const healthUsage = "health [--store] [--wait D] [URL]"

var healthCmd = &command{
	name:  "health",
	usage: healthUsage,
	short: "exit 0 when the control plane's gRPC health is SERVING (--store: its store, e.g. Redis, too), or when URL (e.g. a data plane's /healthz) answers 200; --wait D keeps asking for up to D; for probes and start-up scripts",
	run:   runHealth,
}

// storeHealthService is the health service on which a control plane
// reports its store (controlplane.StoreHealthService): NOT_SERVING while
// a replica cannot reach Redis and admits from its local share.
const storeHealthService = "clodex.controlplane.v1.Store"

// healthPoll is how often --wait asks again.
const healthPoll = 200 * time.Millisecond

type healthArgs struct {
	store bool
	wait  time.Duration
}

// runHealth checks the control plane's grpc.health.v1 service (no token
// needed), or GETs an http:// URL. It prints one line and exits 1 when
// unhealthy, so container and systemd health checks can run it without a
// shell.
func runHealth(ctx context.Context, e *env, args []string) error {
	var a healthArgs
	fs := e.flagSet("health")
	fs.BoolVar(&a.store, "store", false, "the control plane's store must be SERVING too (a replica over Redis that cannot reach it is not)")
	fs.DurationVar(&a.wait, "wait", 0, "keep asking until healthy, for at most this long (0..10m; default 0: ask once)")
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
	if a.wait < 0 || a.wait > 10*time.Minute {
		return usagef("--wait %v is out of range; allowed 0..10m", a.wait)
	}
	if len(pos) == 1 && a.store {
		return usagef("--store applies to the control plane's health, not to a URL")
	}
	check := func(ctx context.Context) (string, error) { return e.grpcHealth(ctx, a.store) }
	if len(pos) == 1 {
		u, err := url.Parse(pos[0])
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usagef("URL %q is not an http:// or https:// URL with a host", pos[0])
		}
		check = func(ctx context.Context) (string, error) { return httpHealth(ctx, u) }
	}
	deadline := time.Now().Add(a.wait)
	for {
		cctx, cancel := e.callCtx(ctx)
		line, err := check(cctx)
		cancel()
		if err == nil {
			fmt.Fprintln(e.stdout, line)
			return nil
		}
		var u *usageError
		if errors.As(err, &u) || !time.Now().Add(healthPoll).Before(deadline) || ctx.Err() != nil {
			if a.wait > 0 && !errors.As(err, &u) {
				return fmt.Errorf("still unhealthy after --wait %v: %w", a.wait, err)
			}
			return err
		}
		if err := sleepCtx(ctx, healthPoll); err != nil {
			return err
		}
	}
}

// grpcHealth asks the control plane's grpc.health.v1 service (no token
// needed): the overall status, or with store the store's as well.
func (e *env) grpcHealth(ctx context.Context, store bool) (string, error) {
	tlsCfg, err := tlsconfig.Client(e.g.tlsCA, e.g.tlsCert, e.g.tlsKey)
	if err != nil {
		return "", usagef("%v", err)
	}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	conn, err := e.newConn(creds)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		c := &client{addr: e.g.controlPlane}
		return "", c.rpcError(err, "", "")
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return "", fmt.Errorf("the control plane at %s is %s", e.g.controlPlane, resp.GetStatus())
	}
	line := e.g.controlPlane + " SERVING"
	st, serr := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: storeHealthService})
	switch {
	case store && serr != nil:
		c := &client{addr: e.g.controlPlane}
		return "", c.rpcError(serr, "", "")
	case store && st.GetStatus() != healthpb.HealthCheckResponse_SERVING:
		return "", fmt.Errorf("the control plane at %s serves, but its store is %s: it cannot reach its store (Redis) and admits from its local share; policy changes and sign-ins wait until it answers", e.g.controlPlane, st.GetStatus())
	case store:
		line += ", store SERVING"
	case serr == nil && st.GetStatus() != healthpb.HealthCheckResponse_SERVING:
		// Without --store an unreachable store does not fail the check:
		// the control plane serves either way.
		line += fmt.Sprintf("\nstore %s: it cannot be reached; this replica admits from its share of each policy", st.GetStatus())
	}
	// With the admin token at hand, what the store lost and restored.
	if h := e.storeLine(ctx); h != "" {
		line += "\nstore: " + h
	}
	return line, nil
}

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

func httpHealth(ctx context.Context, u *url.URL) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", usagef("URL %q: %v", u.Redacted(), err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)
	}
	return u.Redacted() + " " + resp.Status, nil
}
