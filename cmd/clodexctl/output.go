package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
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
	// PausedUntilUnixMs is when the pause after an upstream 403 ends
	// (adaptive mode); absent when not paused.
	PausedUntilUnixMs int64 `json:"paused_until_unix_ms,omitempty"`
	// Unreadable, when set, says the account's stored policy does not
	// decode (which record and why); the policy shown is the last good
	// copy the control plane holds.
	Unreadable string `json:"unreadable,omitempty"`
	// Store is the store that served a get or accounts (absent from the
	// answers of changes).
	Store *storeView `json:"store,omitempty"`
}

// storeView is the store that served an answer.
type storeView struct {
	Kind     string `json:"kind"`              // memory or redis
	Address  string `json:"address,omitempty"` // the policy file, or Redis without credentials
	Replica  string `json:"replica,omitempty"`
	Replicas int32  `json:"replicas"`
	Degraded bool   `json:"degraded"`
	Epoch    string `json:"epoch,omitempty"`
	// LostUnixMs is when the answering replica last found the store had
	// lost data, Loss what it found; RestoredUnixMs and Restored the
	// restore that followed (or a restore from a backup).
	LostUnixMs     int64    `json:"lost_unix_ms,omitempty"`
	Loss           string   `json:"loss,omitempty"`
	RestoredUnixMs int64    `json:"restored_unix_ms,omitempty"`
	Restored       string   `json:"restored,omitempty"`
	Healing        bool     `json:"healing,omitempty"`
	Warnings       []string `json:"warnings,omitempty"`
}

func storeOf(s *controlplanev1.StoreInfo) *storeView {
	if s == nil {
		return nil
	}
	return &storeView{Kind: s.GetKind(), Address: s.GetAddress(), Replica: s.GetReplica(), Replicas: s.GetReplicas(), Degraded: s.GetDegraded(),
		Epoch: s.GetEpoch(), LostUnixMs: s.GetLostUnixMs(), Loss: s.GetLoss(), RestoredUnixMs: s.GetRestoredUnixMs(),
		Restored: s.GetRestored(), Healing: s.GetHealing(), Warnings: s.GetWarnings()}
}

// History describes the store's last loss and restore on one line ("" when
// there was none).
func (s *storeView) History() string {
	var parts []string
	if s.LostUnixMs > 0 {
		parts = append(parts, "LOST DATA at "+time.UnixMilli(s.LostUnixMs).UTC().Format(time.RFC3339)+": "+s.Loss)
	}
	if s.Healing {
		parts = append(parts, "HEALING: the replicas are writing the durable state back")
	} else if s.RestoredUnixMs > 0 {
		parts = append(parts, "restored at "+time.UnixMilli(s.RestoredUnixMs).UTC().Format(time.RFC3339)+": "+s.Restored)
	}
	for _, w := range s.Warnings {
		parts = append(parts, "WARNING: "+w)
	}
	return strings.Join(parts, "; ")
}

// String describes the store on one line.
func (s *storeView) String() string {
	var out string
	switch {
	case s.Kind == "memory" && s.Address == "":
		out = "memory (not persisted)"
	case s.Kind == "memory":
		out = "memory (" + s.Address + ")"
	default:
		out = fmt.Sprintf("%s %s, replica %s of %d live", s.Kind, s.Address, s.Replica, s.Replicas)
	}
	if s.Degraded {
		out += "; DEGRADED: the store is unreachable, this replica answers from the last known policies and admits from its share"
	}
	if h := s.History(); h != "" {
		out += "; " + h
	}
	return out
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
		PausedUntilUnixMs:      a.GetPausedUntilUnixMs(),
		Unreadable:             a.GetUnreadable(),
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
	if v.Unreadable != "" {
		return "UNREADABLE"
	}
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
	}
	if v.PausedUntilUnixMs > 0 {
		rows = append(rows, [2]string{"PAUSED UNTIL", time.UnixMilli(v.PausedUntilUnixMs).UTC().Format(time.RFC3339) + " (new sockets wait: an upstream 403)"})
	}
	rows = append(rows, [][2]string{
		{"BURST", fmt.Sprint(v.Burst)},
		{"TOKENS", tokens(v.Tokens)},
		{"WAIT BOUND", ms(v.WaitBoundMs)},
		{"IDLE TIMEOUT", ms(v.IdleTimeoutMs)},
		{"TOTAL TIMEOUT", ms(v.TotalTimeoutMs)},
		{"MAX RETRIES", fmt.Sprint(v.MaxRetries)},
		{"CAN REFUSE", fmt.Sprint(v.CanRefuse)},
		{"PACING", onOff(v.Enabled)},
		{"POLICY", fmt.Sprintf("%s (version %d)", policyKind(v), v.PolicyVersion)},
	}...)
	if v.Unreadable != "" {
		rows = append(rows, [2]string{"UNREADABLE", v.Unreadable})
	}
	if v.Store != nil {
		rows = append(rows, [2]string{"STORE", v.Store.String()})
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

// writeAccounts prints accounts as a table, one per row, then the store
// that served them.
func writeAccounts(w io.Writer, vs []accountView, store *storeView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tRATE/MIN\tEFFECTIVE\tADAPTIVE\tBURST\tTOKENS\tWAIT BOUND\tIDLE\tTOTAL\tRETRIES\tPOLICY\tVERSION")
	for _, v := range vs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\n", v.Key, v.RatePerMinute, v.EffectiveRatePerMinute,
			onOff(v.Adaptive), v.Burst, tokens(v.Tokens), ms(v.WaitBoundMs), ms(v.IdleTimeoutMs), ms(v.TotalTimeoutMs),
			v.MaxRetries, policyKind(v), v.PolicyVersion)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range vs {
		if v.Unreadable != "" {
			fmt.Fprintf(w, "unreadable: %s: %s\n", v.Key, v.Unreadable)
		}
	}
	if store != nil {
		_, err := fmt.Fprintf(w, "store: %s\n", store)
		return err
	}
	return nil
}

// printAccount writes one account in the chosen format.
func (e *env) printAccount(v accountView) error {
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	return writeAccount(e.stdout, v)
}
