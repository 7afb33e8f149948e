package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
)

// DataPlane is a running clodex-dataplane.
type DataPlane struct {
	p *proc
	// BaseURL is its Anthropic API, http://127.0.0.1:PORT.
	BaseURL string
	// Log is its log file.
	Log string
}

var dataPlaneReady = regexp.MustCompile(`ANTHROPIC_BASE_URL=(http://127\.0\.0\.1:[0-9]+)`)

// StartDataPlane starts one more data plane, like the fleet's own, with
// args after theirs (a flag given again takes the later value: e.g.
// --agent-token-file of a scoped agent credential), and adds it to
// DataPlanes.
func (f *Fleet) StartDataPlane(ctx context.Context, args ...string) (*DataPlane, error) {
	dp, err := f.startDataPlane(ctx, len(f.DataPlanes), args...)
	if err != nil {
		return nil, err
	}
	f.DataPlanes = append(f.DataPlanes, dp)
	return dp, nil
}

func (f *Fleet) startDataPlane(ctx context.Context, i int, extra ...string) (*DataPlane, error) {
	o := f.opts
	home := filepath.Join(o.Dir, fmt.Sprintf("dp%d", i))
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, fmt.Errorf("start data plane %d: %w", i, err)
	}
	authPath := filepath.Join(home, "auth.json")
	if err := atomicfile.WriteFile(authPath, AuthJSON(Token, Account), 0o600); err != nil {
		return nil, fmt.Errorf("start data plane %d: %w", i, err)
	}
	args := []string{
		"--listen", "127.0.0.1:0",
		"--upstream-url", f.Sim.WSURL,
		"--log-level", "info",
	}
	if !o.Broker { // with the broker, no auth.json: tokens come from the control plane
		args = append(args, "--codex-auth", authPath)
	}
	env := append([]string(nil), f.env...)
	env[0] = "HOME=" + home
	switch o.Mode {
	case Central:
		args = append(args, "--control-plane", f.controlPlaneAddrs(), "--agent-token-file", f.ControlPlane.agentToken)
	case PerHost:
		env = append(env, "CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN="+strconv.Itoa(o.Rate))
	}
	if f.refreshFlag && !o.Broker {
		args = append(args, "--refresh=never") // the emulator's token never expires; nothing to refresh
	}
	args = append(args, o.DataPlaneArgs...)
	args = append(args, extra...)
	logPath := filepath.Join(o.Dir, fmt.Sprintf("dataplane%d.log", i))
	p, base, err := startProc(ctx, fmt.Sprintf("clodex-dataplane %d", i), o.Bins.DataPlane, args, env, logPath, dataPlaneReady, o.ReadyTimeout)
	if err != nil {
		return nil, err
	}
	f.log.Info("clodex-dataplane ready", "n", i, "url", base, "mode", o.Mode)
	return &DataPlane{p: p, BaseURL: base, Log: logPath}, nil
}

// AuthJSON is a Codex CLI auth.json (ChatGPT mode) holding an opaque
// access token and the account id.
func AuthJSON(token, account string) []byte {
	b, _ := json.MarshalIndent(map[string]any{
		"auth_mode":      "chatgpt",
		"OPENAI_API_KEY": nil,
		"tokens": map[string]string{
			"id_token":      "",
			"access_token":  token,
			"refresh_token": "",
			"account_id":    account,
		},
		"last_refresh": time.Now().UTC().Format(time.RFC3339),
	}, "", "  ")
	return append(b, '\n')
}
