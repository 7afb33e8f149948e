//go:build linux

package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim"
)

// The real descriptor test (docs/pool.md §8): a child process with hard and soft
// RLIMIT_NOFILE lowered to 40 holds one pooled coder/websocket per
// conversation; the emulator (a real codexsim.Server) runs in this (parent)
// process with the normal limit; no pacing (the pool has no Admitter).
// 60 fresh conversations must all succeed, with one notice and idle heads
// shed.

const (
	fdChildEnv   = "CLODEX_POOL_FD_CHILD_URL"
	fdChildLimit = 40
	fdChildConvs = 60

	// The credential the emulator accepts and the child presents.
	fdSimToken   = "tok-fd"
	fdSimAccount = "acct-fd"
)

type fdChildResult struct {
	OK, Failed   int
	Errors       []string
	Notices      []string
	Shed         uint64
	Exhaustions  uint64
	Records      []map[string]any
	FinalHeads   int
	DialAttempts int
}

func TestDescriptorExhaustionRealSockets(t *testing.T) {
	if u := os.Getenv(fdChildEnv); u != "" {
		fdChild(t, u)
		return
	}
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	sim, err := codexsim.New(codexsim.Config{
		AcceptTokens: map[string]string{fdSimToken: fdSimAccount},
		// Both routes together dial well over the default 80 upgrades a
		// minute; the throttle is not what this test is about.
		UpgradeLimit: 100000,
	})
	if err != nil {
		t.Fatalf("codexsim.New: %v", err)
	}
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()
	defer sim.Close()
	u, _ := url.Parse(srv.URL)
	for _, route := range []struct{ name, host string }{
		{"numeric address", u.Host},           // 127.0.0.1:port: socket() fails with EMFILE
		{"hostname", "localhost:" + u.Port()}, // the lookup fails first; the probe classifies it
	} {
		t.Run(route.name, func(t *testing.T) {
			before := sim.Stats().CompletedResponses
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDescriptorExhaustionRealSockets$", "-test.count=1")
			cmd.Env = append(os.Environ(), fdChildEnv+"=ws://"+route.host+codexsim.ChatGPTPath)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("child: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
			}
			var res fdChildResult
			line := ""
			for l := range strings.SplitSeq(stdout.String(), "\n") {
				if s, ok := strings.CutPrefix(l, "FDRESULT "); ok {
					line = s
				}
			}
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				t.Fatalf("child result %q: %v\n%s", line, err, stdout.String())
			}
			t.Logf("child: %d ok, %d failed, exhaustions %d, shed %d, heads at end %d, notice %q, records %v",
				res.OK, res.Failed, res.Exhaustions, res.Shed, res.FinalHeads, res.Notices, res.Records)
			if res.OK != fdChildConvs || res.Failed != 0 {
				t.Errorf("%d of %d conversations succeeded (errors %q), want all", res.OK, fdChildConvs, res.Errors)
			}
			if len(res.Notices) != 1 || !strings.Contains(res.Notices[0], "EMFILE") || !strings.Contains(res.Notices[0], "ulimit -n") {
				t.Errorf("notices %q, want exactly one naming EMFILE and ulimit -n", res.Notices)
			}
			if res.Exhaustions < 1 || res.Shed == 0 {
				t.Errorf("exhaustions %d shed %d, want at least one exhaustion that shed heads", res.Exhaustions, res.Shed)
			}
			if got := sim.Stats().CompletedResponses - before; got != fdChildConvs {
				t.Errorf("emulator completed %d responses for this child, want %d", got, fdChildConvs)
			}
		})
	}
}

func fdChild(t *testing.T, wsURL string) {
	lim := syscall.Rlimit{Cur: fdChildLimit, Max: fdChildLimit}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("setrlimit: %v", err)
	}
	var mu sync.Mutex
	var res fdChildResult
	var diag bytes.Buffer
	attempts := 0
	tr := &http.Transport{DisableKeepAlives: true}
	p, err := New(Config{
		Upstream: upstream.DialOptions{URL: wsURL, DialTimeout: 10 * time.Second, ReadLimit: 1 << 20,
			HTTPClient: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				attempts++
				return tr.RoundTrip(r)
			})}},
		Credentials: staticCredentials(codexauth.Credential{AccessToken: fdSimToken, AccountID: fdSimAccount}),
		Notify:      func(msg string) { mu.Lock(); res.Notices = append(res.Notices, msg); mu.Unlock() },
		Diagnostics: &diag,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i := range fdChildConvs {
		pt := Partition{Account: "acct", Model: "gpt-5-codex", PromptCacheKey: fmt.Sprintf("conv-%d", i)}
		in := [][]byte{user(fmt.Sprintf("conversation %d", i))}
		if err := fdChildTurn(ctx, p, pt, in); err != nil {
			res.Failed++
			res.Errors = append(res.Errors, err.Error())
			continue
		}
		res.OK++
	}
	s := p.Stats()
	res.Shed, res.Exhaustions, res.FinalHeads, res.DialAttempts = s.ShedConnections, s.DescriptorExhaustions, s.Nursery+s.Established, attempts
	for line := range strings.SplitSeq(diag.String(), "\n") {
		if strings.Contains(line, "ws_descriptor_exhaustion") {
			var m map[string]any
			_ = json.Unmarshal([]byte(line), &m)
			delete(m, "time")
			res.Records = append(res.Records, m)
		}
	}
	_ = p.Close()
	b, _ := json.Marshal(res)
	fmt.Printf("FDRESULT %s\n", b)
}

func fdChildTurn(ctx context.Context, p *Pool, pt Partition, in [][]byte) error {
	l, err := p.Acquire(ctx, pt, in)
	if err != nil {
		return err
	}
	frame, _ := json.Marshal(map[string]any{"type": "response.create", "model": pt.Model, "input": rawItems(in[l.Delta:])})
	if err := l.Conn.Send(ctx, frame); err != nil {
		l.Discard("send failed")
		return err
	}
	// The emulator streams the whole event sequence (rate limits, created,
	// deltas, ...); the turn ends at response.completed, and any error or
	// failure frame fails it.
	for {
		b, err := l.Conn.Next(ctx)
		if err != nil {
			l.Discard("read failed")
			return err
		}
		var ev struct {
			Type     string `json:"type"`
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if err := json.Unmarshal(b, &ev); err != nil {
			l.Discard("bad event")
			return fmt.Errorf("decode event %q: %w", b, err)
		}
		switch ev.Type {
		case "response.completed":
			if ev.Response.ID == "" {
				l.Discard("bad event")
				return fmt.Errorf("response.completed without a response id: %s", b)
			}
			l.Complete(ev.Response.ID, [][]byte{assistant("ok")}, Usage{})
			return nil
		case "error", "response.failed", "response.incomplete":
			l.Discard("bad event")
			return errors.New("unexpected event " + string(b))
		}
	}
}
