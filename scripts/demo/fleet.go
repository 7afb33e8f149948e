package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	crand "crypto/rand" // the demo's secrets must not be guessable by another user of the machine

	"github.com/clodex/clodex/bench/fleet/cluster"
	"github.com/clodex/clodex/internal/atomicfile"
)

// The recommended team set-up of docs/operations.md §1.1, on loopback:
// clodex-sim as the backend (it writes the auth.json of its account),
// Redis, two control-plane replicas over it running the credential broker,
// the account imported once, a scoped agent token per data plane, and the
// data planes without an auth.json: they take access tokens from the
// broker.

// simAccount is the ChatGPT account clodex-sim signs in.
const simAccount = "acct-sim"

// fleet is what startFleet set up.
type fleet struct {
	replicas   []string // the control-plane replicas' gRPC addresses
	cpAdmins   []string // their admin listeners
	dataPlanes []string // the data planes' API bases, http://…
}

// secret writes a fresh random secret to path, mode 0600.
func secret(path string) error {
	b := make([]byte, 32)
	_, _ = crand.Read(b) // never fails (crypto/rand documents it)
	return atomicfile.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(b)+"\n"), 0o600)
}

// startFleet brings the team set-up up, in the order of docs/operations.md
// §1.1. otel gives a process's OTLP environment by service name.
func (d *demo) startFleet(ctx context.Context, addrs map[string]string, otel func(string) []string, say func(string, ...any)) (*fleet, error) {
	o := d.o
	bin := func(name string) string { return filepath.Join(o.bin, name) }
	f := &fleet{}

	// The backend and the auth.json of its account.
	say("clodex-sim on %s (the backend, and the sign-in of %s)", addrs["sim"], simAccount)
	simAuth := filepath.Join(o.dir, "sim", "auth.json")
	sp, err := d.run("clodex-sim", bin("clodex-sim"), nil, "--listen", addrs["sim"], "--write-auth", simAuth, "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, sp, d.simURL+"/sim/stats"); err != nil {
		return nil, err
	}

	// Tokens and the credential key.
	etc := filepath.Join(o.dir, "etc")
	if err := os.MkdirAll(etc, 0o700); err != nil {
		return nil, err
	}
	admin, agent, key := filepath.Join(etc, "admin.token"), filepath.Join(etc, "agent.token"), filepath.Join(etc, "credential.key")
	for _, p := range []string{admin, agent, key} {
		if err := secret(p); err != nil {
			return nil, err
		}
	}

	// Redis, persistent (AOF), in the demo's folder.
	say("redis-server on %s", addrs["redis"])
	host, port, _ := strings.Cut(addrs["redis"], ":")
	rp, err := d.run("redis", o.redis, nil, "--port", port, "--bind", host, "--dir", o.dir, "--appendonly", "yes", "--save", "")
	if err != nil {
		return nil, err
	}
	if err := waitTCP(ctx, rp, addrs["redis"]); err != nil {
		return nil, err
	}

	// Two control-plane replicas over Redis, running the credential broker.
	redisURL := "redis://" + addrs["redis"] + "/0"
	for i, k := range []string{"cp1", "cp2"} {
		name := fmt.Sprintf("clodex-controlplane-%d", i+1)
		say("%s on %s (replica cp-%d over Redis, the credential broker)", name, addrs[k], i+1)
		env := append(otel(name), "CLODEX_TOKEN_ENDPOINT="+d.simURL+"/oauth/token")
		p, err := d.run(name, bin("clodex-controlplane"), env,
			"--listen", addrs[k], "--admin-listen", addrs[k+"-admin"], "--replica", fmt.Sprintf("cp-%d", i+1), "--redis", redisURL,
			"--admin-token-file", admin, "--agent-token-file", agent, "--credential-key-file", key)
		if err != nil {
			return nil, err
		}
		if err := waitHTTP(ctx, p, "http://"+addrs[k+"-admin"]+"/metrics"); err != nil {
			return nil, err
		}
		f.replicas = append(f.replicas, addrs[k])
		f.cpAdmins = append(f.cpAdmins, addrs[k+"-admin"])
	}
	replicas := strings.Join(f.replicas, ",")
	ctl := func(args ...string) error { return d.clodexctl(ctx, replicas, admin, args...) }
	for _, r := range f.replicas {
		if err := d.clodexctl(ctx, r, admin, "health", "--store", "--wait", "30s"); err != nil {
			return nil, err
		}
	}

	// The account, signed in once for the fleet; a scoped agent token per
	// data plane.
	say("clodexctl account import: the broker holds %s's sign-in", simAccount)
	if err := ctl("account", "import", "--codex-auth", simAuth); err != nil {
		return nil, err
	}
	// Every token first, then the data planes, as §1.1 does: a replica
	// reads the credentials again for an unknown token at most four times
	// a second, so a token created just after a data plane's first call
	// can be refused for a moment.
	hosts := []string{"dp1", "dp2"}
	for i := range hosts {
		tok := filepath.Join(etc, fmt.Sprintf("host-%d.token", i+1))
		say("clodexctl agent create host-%d --accounts %s --out %s", i+1, simAccount, tok)
		if err := ctl("agent", "create", fmt.Sprintf("host-%d", i+1), "--accounts", simAccount, "--out", tok); err != nil {
			return nil, err
		}
	}
	for i, k := range hosts {
		name := fmt.Sprintf("clodex-dataplane-%d", i+1)
		tok := filepath.Join(etc, fmt.Sprintf("host-%d.token", i+1))
		say("%s on %s with host-%d's token and no auth.json", name, addrs[k], i+1)
		p, err := d.run(name, bin("clodex-dataplane"), otel(name),
			"--listen", addrs[k], "--admin-listen", addrs[k+"-admin"],
			"--control-plane", replicas, "--agent-token-file", tok,
			"--upstream-url", "ws://"+addrs["sim"]+"/backend-api/codex/responses")
		if err != nil {
			return nil, err
		}
		if err := waitHTTP(ctx, p, "http://"+addrs[k]+"/healthz"); err != nil {
			return nil, err
		}
		f.dataPlanes = append(f.dataPlanes, "http://"+addrs[k])
	}
	// A turn through each data plane, as the set-up ends: a data plane
	// that has no access token from the broker yet answers 503 with
	// retry-after, and is asked again.
	for i, base := range f.dataPlanes {
		name := fmt.Sprintf("clodex-dataplane-%d", i+1)
		n, err := firstTurn(ctx, base)
		d.firstRequests[name] = n
		if err != nil {
			return nil, fmt.Errorf("a first turn through %s: %w", name, err)
		}
		say("a first turn through %s: answered (requests sent: %d)", name, n)
	}
	return f, nil
}

// firstTurn sends one turn to the data plane at base until it is answered,
// waiting each 503 or 429's retry-after (at most 5 s), for up to 30 s. It
// returns how many requests it sent.
func firstTurn(ctx context.Context, base string) (int, error) {
	deadline := time.Now().Add(30 * time.Second)
	for n := 1; ; n++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", bytes.NewReader(cluster.TurnRequest(cluster.NewSessionID())))
		if err != nil {
			return n, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return n, err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK && bytes.Contains(body, []byte("message_stop")):
			return n, nil
		case resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusTooManyRequests:
			return n, fmt.Errorf("status %d: %s", resp.StatusCode, lastLines(string(body), 5))
		case time.Now().After(deadline):
			return n, fmt.Errorf("still status %d after 30 s: %s", resp.StatusCode, lastLines(string(body), 5))
		}
		wait := min(max(cluster.ParseRetryAfter(resp.Header.Get("retry-after")), 100*time.Millisecond), 5*time.Second)
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// clodexctl runs clodexctl args against the replicas (a comma-separated
// list) with the admin token; its output goes to clodexctl.log in the
// demo's folder, and into the error when it fails.
func (d *demo) clodexctl(ctx context.Context, replicas, adminToken string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(d.o.bin, "clodexctl"), args...) //nolint:gosec // G204: the clodexctl of --bin, with the demo's own arguments
	cmd.Env = []string{"HOME=" + d.o.dir, "PATH=" + os.Getenv("PATH"), "CLODEX_CONTROL_PLANE=" + replicas, "CLODEX_ADMIN_TOKEN_FILE=" + adminToken}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if lf, lerr := os.OpenFile(filepath.Join(d.o.dir, "clodexctl.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); lerr == nil {
		fmt.Fprintf(lf, "$ clodexctl %s\n%s", strings.Join(args, " "), out.String())
		_ = lf.Close()
	}
	if err != nil {
		return fmt.Errorf("clodexctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
