package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/clodex/clodex/internal/codexsim"
)

// Sim is a running clodex-sim.
type Sim struct {
	p *proc
	// URL is its HTTP base, http://127.0.0.1:PORT.
	URL string
	// WSURL is the ChatGPT Responses WebSocket URL.
	WSURL string
}

var simReady = regexp.MustCompile(`^ws://(127\.0\.0\.1:[0-9]+)/`)

func (f *Fleet) startSim(ctx context.Context) error {
	o := f.opts
	args := []string{
		"--listen", "127.0.0.1:0",
		"--accept-token", Token + "=" + Account,
		"--upgrade-limit", strconv.Itoa(o.UpgradeLimit),
		"--upgrade-window", o.UpgradeWindow.String(),
		"--log-level", "warn",
	}
	if o.TokenTTL > 0 {
		args = append(args, "--token-ttl", o.TokenTTL.String())
	}
	if o.Broker {
		f.LoginAuth = filepath.Join(o.Dir, "login", "auth.json")
		if err := os.MkdirAll(filepath.Dir(f.LoginAuth), 0o700); err != nil {
			return fmt.Errorf("start clodex-sim: %w", err)
		}
		args = append(args, "--write-auth", f.LoginAuth, "--auth-account", Account, "--log-level", "info")
	}
	p, addr, err := startProc(ctx, "clodex-sim", o.Bins.Sim, args, f.env, filepath.Join(o.Dir, "sim.log"), simReady, o.ReadyTimeout)
	if err != nil {
		return err
	}
	f.Sim = &Sim{p: p, URL: "http://" + addr, WSURL: "ws://" + addr + codexsim.ChatGPTPath}
	f.log.Info("clodex-sim ready", "url", f.Sim.URL, "upgrade_limit", o.UpgradeLimit, "upgrade_window", o.UpgradeWindow)
	return nil
}

// Stats reads clodex-sim's counters.
func (s *Sim) Stats(ctx context.Context, client *http.Client) (codexsim.Stats, error) {
	var st codexsim.Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+codexsim.StatsPath, nil)
	if err != nil {
		return st, fmt.Errorf("read sim stats: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return st, fmt.Errorf("read sim stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("read sim stats: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("read sim stats: %w", err)
	}
	return st, nil
}

// Configure changes clodex-sim's running knobs (POST /sim/config); patch
// is a codexsim.ConfigPatch as JSON, e.g. {"upgrade_limit":2}.
func (s *Sim) Configure(ctx context.Context, client *http.Client, patch string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+codexsim.ConfigPath, strings.NewReader(patch))
	if err != nil {
		return fmt.Errorf("configure sim: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("configure sim: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return fmt.Errorf("configure sim: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}
