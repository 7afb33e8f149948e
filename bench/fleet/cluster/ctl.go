package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Ctl runs clodexctl against this control plane with the admin token and
// returns its stdout.
func (cp *ControlPlane) Ctl(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"--control-plane", cp.Addr, "--token-file", cp.adminToken, "--timeout", "3s"}, args...)
	out, err := runOut(ctx, 10*time.Second, cp.f.opts.Bins.Ctl, full, cp.f.env)
	if err != nil {
		return out, fmt.Errorf("clodexctl %s: %w", strings.Join(args, " "), err)
	}
	return out, nil
}

// AccountView is the part of `clodexctl get -o json` the fleet reads.
type AccountView struct {
	RatePerMinute          int     `json:"rate_per_minute"`
	EffectiveRatePerMinute *int    `json:"effective_rate_per_minute"` // nil when the control plane does not report it
	Burst                  int     `json:"burst"`
	Tokens                 float64 `json:"tokens"`
	PolicyVersion          int64   `json:"policy_version"`
}

// SetRate sets the fleet account's rate and burst.
func (cp *ControlPlane) SetRate(ctx context.Context, rate, burst int) (AccountView, error) {
	return cp.account(ctx, "set-rate", Account, strconv.Itoa(rate), "--burst", strconv.Itoa(burst), "-o", "json")
}

// Get reads the fleet account.
func (cp *ControlPlane) Get(ctx context.Context) (AccountView, error) {
	return cp.account(ctx, "get", Account, "-o", "json")
}

func (cp *ControlPlane) account(ctx context.Context, args ...string) (AccountView, error) {
	out, err := cp.Ctl(ctx, args...)
	if err != nil {
		return AccountView{}, err
	}
	var v AccountView
	if err := json.Unmarshal(out, &v); err != nil {
		return AccountView{}, fmt.Errorf("clodexctl %s: decode output: %w", args[0], err)
	}
	return v, nil
}

// AgentView is the part of `clodexctl agents -o json` the fleet reads.
type AgentView struct {
	ID       string   `json:"id"`
	Host     string   `json:"host"`
	Accounts []string `json:"accounts"`
	LastSeen string   `json:"last_seen"`
	Live     *bool    `json:"live"`
}

// Agents lists the agents the control plane knows.
func (cp *ControlPlane) Agents(ctx context.Context) ([]AgentView, error) {
	out, err := cp.Ctl(ctx, "agents", "-o", "json")
	if err != nil {
		return nil, err
	}
	var v []AgentView
	if err := json.Unmarshal(out, &v); err != nil {
		return nil, fmt.Errorf("clodexctl agents: decode output: %w", err)
	}
	return v, nil
}

// SetAdaptive turns the fleet account's adaptive mode on or off.
func (cp *ControlPlane) SetAdaptive(ctx context.Context, on bool) error {
	v := "off"
	if on {
		v = "on"
	}
	_, err := cp.Ctl(ctx, "set-adaptive", Account, v)
	return err
}
