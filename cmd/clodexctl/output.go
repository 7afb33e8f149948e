package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// accountView is an account as clodexctl prints it. JSON keys are
// snake_case and values are JSON numbers; scripts rely on them.
type accountView struct {
	Account        string  `json:"account,omitempty"` // the ACCOUNT argument, or the key with --key
	Key            string  `json:"key"`
	RatePerMinute  int32   `json:"rate_per_minute"`
	Burst          int32   `json:"burst"`
	Tokens         float64 `json:"tokens"`
	WaitBoundMs    int64   `json:"wait_bound_ms"`
	IdleTimeoutMs  int64   `json:"idle_timeout_ms"`
	TotalTimeoutMs int64   `json:"total_timeout_ms"`
	MaxRetries     int32   `json:"max_retries"`
	PolicyVersion  int64   `json:"policy_version"`
	CanRefuse      bool    `json:"can_refuse"`
	Enabled        bool    `json:"enabled"`
	Custom         bool    `json:"custom"`
	// EffectiveRatePerMinute is the rate the bucket paces at: RatePerMinute
	// (configured) unless adaptive mode has lowered it.
	EffectiveRatePerMinute int32 `json:"effective_rate_per_minute"`
	Adaptive               bool  `json:"adaptive"`
}

func view(label string, a *controlplanev1.Account) accountView {
	return accountView{
		Account:        label,
		Key:            a.GetKey(),
		RatePerMinute:  a.GetRatePerMinute(),
		Burst:          a.GetBurst(),
		Tokens:         math.Round(a.GetTokens()*1000) / 1000,
		WaitBoundMs:    a.GetWaitBoundMs(),
		IdleTimeoutMs:  a.GetIdleTimeoutMs(),
		TotalTimeoutMs: a.GetTotalTimeoutMs(),
		MaxRetries:     a.GetMaxRetries(),
		PolicyVersion:  a.GetPolicyVersion(),
		CanRefuse:      a.GetCanRefuse(),
		Enabled:        a.GetEnabled(),
		Custom:         a.GetCustom(),

		EffectiveRatePerMinute: a.GetEffectiveRatePerMinute(),
		Adaptive:               a.GetAdaptive(),
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func ms(n int64) string { return (time.Duration(n) * time.Millisecond).String() }

func tokens(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) }

func policyKind(v accountView) string {
	if v.Custom {
		return "custom"
	}
	return "default"
}

// writeAccount prints one account as a two-column table.
func writeAccount(w io.Writer, v accountView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rows := [][2]string{
		{"ACCOUNT", v.Account},
		{"KEY", v.Key},
		{"RATE", fmt.Sprintf("%d/min", v.RatePerMinute)},
		{"EFFECTIVE RATE", fmt.Sprintf("%d/min", v.EffectiveRatePerMinute)},
		{"ADAPTIVE", onOff(v.Adaptive)},
		{"BURST", fmt.Sprint(v.Burst)},
		{"TOKENS", tokens(v.Tokens)},
		{"WAIT BOUND", ms(v.WaitBoundMs)},
		{"IDLE TIMEOUT", ms(v.IdleTimeoutMs)},
		{"TOTAL TIMEOUT", ms(v.TotalTimeoutMs)},
		{"MAX RETRIES", fmt.Sprint(v.MaxRetries)},
		{"CAN REFUSE", fmt.Sprint(v.CanRefuse)},
		{"PACING", onOff(v.Enabled)},
		{"POLICY", fmt.Sprintf("%s (version %d)", policyKind(v), v.PolicyVersion)},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// writeAccounts prints accounts as a table, one per row.
func writeAccounts(w io.Writer, vs []accountView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tRATE/MIN\tEFFECTIVE\tADAPTIVE\tBURST\tTOKENS\tWAIT BOUND\tIDLE\tTOTAL\tRETRIES\tPOLICY\tVERSION")
	for _, v := range vs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\n", v.Key, v.RatePerMinute, v.EffectiveRatePerMinute,
			onOff(v.Adaptive), v.Burst, tokens(v.Tokens), ms(v.WaitBoundMs), ms(v.IdleTimeoutMs), ms(v.TotalTimeoutMs),
			v.MaxRetries, policyKind(v), v.PolicyVersion)
	}
	return tw.Flush()
}

// printAccount writes one account in the chosen format.
func (e *env) printAccount(v accountView) error {
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	return writeAccount(e.stdout, v)
}
