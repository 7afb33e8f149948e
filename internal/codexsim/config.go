package codexsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/clodex/clodex/internal/codexsim/simauth"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultUpgradeLimit   = 80
	DefaultUpgradeWindow  = 60 * time.Second
	DefaultMaxFrameBytes  = 32 << 20
	DefaultSocketLifetime = 60 * time.Minute
	DefaultWriteTimeout   = 30 * time.Second
	DefaultUsageLimitPlan = "plus"
)

// validCode reports whether s is a bounded identifier, as error codes and
// plan names are: letters, digits, '_', '.', ':' and '-', at most 64 bytes.
func validCode(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// Config configures a Server. New copies it; the caller's value is never
// modified. The zero value is usable.
type Config struct {
	// UpgradeLimit is the number of accepted upgrades per account in the
	// trailing UpgradeWindow; the next one answers 403. (Optional) Default 80.
	UpgradeLimit int
	// UpgradeWindow is the length of the throttle window. (Optional) Default 60s.
	UpgradeWindow time.Duration
	// CountRejected makes throttle rejections count toward the window.
	// (Optional) Default false: only accepted upgrades count.
	CountRejected bool
	// InstantLimit caps upgrades per account in any trailing second.
	// (Optional) Default 0 = off.
	InstantLimit int
	// MaxOpenSockets caps concurrently open sockets per account; an upgrade
	// over the cap answers 403. (Optional) Default 0 = off.
	MaxOpenSockets int
	// AcceptTokens maps bearer tokens to ChatGPT account ids; they are
	// accepted without signature checks. (Optional)
	AcceptTokens map[string]string
	// MaxFrameBytes is the largest client frame accepted; a larger one gets
	// an error frame with code request_too_large and the socket stays open.
	// (Optional) Default 32 MiB.
	MaxFrameBytes int64
	// SocketLifetime is how long a socket may serve responses; the next
	// response.create on an older socket answers
	// websocket_connection_limit_reached. (Optional) Default 60 minutes.
	SocketLifetime time.Duration
	// DeltaInterval is the pause between two delta events. (Optional) Default 0.
	DeltaInterval time.Duration
	// WriteTimeout bounds the write of one frame: a client that does not
	// read for this long gets its socket closed (the backend does not
	// buffer without bound for a peer that stopped reading), and the
	// response writing to it ends. (Optional) Default 30s.
	WriteTimeout time.Duration
	// Faults injects failures on demand. (Optional) Default none.
	Faults Faults
	// Quota is the plan usage reported in codex.rate_limits, per account,
	// and the usage limit it reaches. (Optional) Default: 7 % of 5 hours
	// and 29 % of a week, never used up.
	Quota Quota
	// Auth, when set, is the OAuth emulator: its signed tokens are accepted
	// and its HTTP endpoints are mounted on Handler. (Optional)
	Auth *simauth.Authority
	// Clock is used for throttle windows and socket lifetime. (Optional)
	// Default time.Now.
	Clock func() time.Time
	// Logger receives connection-level records, never tokens. (Optional)
	// Default: discard.
	Logger *slog.Logger
	// RecordFrames keeps every frame of every socket, both directions, and
	// how the client closed it, for Server.Sockets: what the backend's
	// peer really did, for in-process tests. The log grows without bound.
	// (Optional) Default off.
	RecordFrames bool
}

// Faults are failures injected on demand. The zero value injects none.
type Faults struct {
	// FirstByteDelay is a pause before the first event of every response.
	FirstByteDelay time.Duration
	// InterEventDelay is a pause between any two events of a response.
	InterEventDelay time.Duration
	// CloseAfterEvents drops a socket (no close frame, the client sees 1006)
	// once it has sent this many events. 0 = off.
	CloseAfterEvents int
	// Upgrade5xxShare is the share of upgrades (after the auth and header
	// checks) that answer Upgrade5xxStatus, in [0, 1]. Deterministic: with
	// share s, dial n fails when floor(n*s) > floor((n-1)*s).
	Upgrade5xxShare float64
	// Upgrade5xxStatus is the status of injected upgrade failures, 500-599.
	// Default 503.
	Upgrade5xxStatus int
	// Stall makes every response send response.created and then nothing.
	Stall bool
	// RetryAfter403, when positive, adds a retry-after header (whole
	// seconds) to throttle 403s. The real edge sends none reliably.
	RetryAfter403 time.Duration
	// FailResponses, when set, is an error code every generating response
	// fails with (response.failed before any output), as "#sim fail" does
	// for one response: server_error, server_is_overloaded,
	// rate_limit_exceeded, ... Prewarms still complete.
	FailResponses string
	// UsageLimitResetsIn, when positive, reaches the plan's usage limit:
	// every response.create is answered with a usage_limit_reached error
	// frame (status 429) whose resets_in_seconds and resets_at count down to
	// a reset UsageLimitResetsIn after the setting took effect (New, or the
	// POST /sim/config that set it). From the reset on, responses run
	// normally again.
	UsageLimitResetsIn time.Duration
	// UsageLimitPlan is the plan_type of usage-limit errors. Default "plus".
	UsageLimitPlan string
}

// validate reports every bad value of c at once.
func (c *Config) validate() error {
	var errs []error
	if c.UpgradeLimit < 0 {
		errs = append(errs, fmt.Errorf("UpgradeLimit %d is invalid; want 0 (default %d) or more", c.UpgradeLimit, DefaultUpgradeLimit))
	}
	if c.UpgradeWindow < 0 {
		errs = append(errs, fmt.Errorf("UpgradeWindow %v is invalid; want 0 (default %v) or a positive duration", c.UpgradeWindow, DefaultUpgradeWindow))
	}
	if c.InstantLimit < 0 {
		errs = append(errs, fmt.Errorf("InstantLimit %d is invalid; want 0 (off) or more", c.InstantLimit))
	}
	if c.MaxOpenSockets < 0 {
		errs = append(errs, fmt.Errorf("MaxOpenSockets %d is invalid; want 0 (off) or more", c.MaxOpenSockets))
	}
	for tok, acct := range c.AcceptTokens {
		if tok == "" {
			errs = append(errs, errors.New("AcceptTokens has an empty token; want non-empty bearer tokens"))
		}
		if acct == "" {
			errs = append(errs, errors.New("AcceptTokens has a token with an empty account id; want TOKEN=ACCOUNT_ID"))
		}
	}
	if c.MaxFrameBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxFrameBytes %d is invalid; want 0 (default %d) or more", c.MaxFrameBytes, DefaultMaxFrameBytes))
	}
	if c.SocketLifetime < 0 {
		errs = append(errs, fmt.Errorf("SocketLifetime %v is invalid; want 0 (default %v) or a positive duration", c.SocketLifetime, DefaultSocketLifetime))
	}
	if c.DeltaInterval < 0 {
		errs = append(errs, fmt.Errorf("DeltaInterval %v is invalid; want 0 or a positive duration", c.DeltaInterval))
	}
	if c.WriteTimeout < 0 {
		errs = append(errs, fmt.Errorf("WriteTimeout %v is invalid; want 0 (default %v) or a positive duration", c.WriteTimeout, DefaultWriteTimeout))
	}
	errs = append(errs, c.Faults.validate()...)
	errs = append(errs, c.Quota.validate()...)
	return errors.Join(errs...)
}

func (f *Faults) validate() []error {
	var errs []error
	if f.FirstByteDelay < 0 {
		errs = append(errs, fmt.Errorf("Faults.FirstByteDelay %v is invalid; want 0 or a positive duration", f.FirstByteDelay))
	}
	if f.InterEventDelay < 0 {
		errs = append(errs, fmt.Errorf("Faults.InterEventDelay %v is invalid; want 0 or a positive duration", f.InterEventDelay))
	}
	if f.CloseAfterEvents < 0 {
		errs = append(errs, fmt.Errorf("Faults.CloseAfterEvents %d is invalid; want 0 (off) or more", f.CloseAfterEvents))
	}
	if !(f.Upgrade5xxShare >= 0 && f.Upgrade5xxShare <= 1) {
		errs = append(errs, fmt.Errorf("Faults.Upgrade5xxShare %v is invalid; want a number in [0, 1]", f.Upgrade5xxShare))
	}
	if f.Upgrade5xxStatus != 0 && (f.Upgrade5xxStatus < 500 || f.Upgrade5xxStatus > 599) {
		errs = append(errs, fmt.Errorf("Faults.Upgrade5xxStatus %d is invalid; want 0 (default 503) or 500-599", f.Upgrade5xxStatus))
	}
	if f.RetryAfter403 < 0 {
		errs = append(errs, fmt.Errorf("Faults.RetryAfter403 %v is invalid; want 0 (none) or a positive duration", f.RetryAfter403))
	}
	if f.FailResponses != "" && !validCode(f.FailResponses) {
		errs = append(errs, fmt.Errorf("Faults.FailResponses %q is invalid; want an error code of letters, digits, '_', '.', ':' or '-' (at most 64)", clip(f.FailResponses, 64)))
	}
	if f.UsageLimitResetsIn < 0 {
		errs = append(errs, fmt.Errorf("Faults.UsageLimitResetsIn %v is invalid; want 0 (off) or a positive duration", f.UsageLimitResetsIn))
	}
	if f.UsageLimitPlan != "" && !validCode(f.UsageLimitPlan) {
		errs = append(errs, fmt.Errorf("Faults.UsageLimitPlan %q is invalid; want a plan name such as plus or pro", clip(f.UsageLimitPlan, 64)))
	}
	return errs
}

// withDefaults returns a copy of c with defaults filled in.
func (c Config) withDefaults() Config {
	if c.UpgradeLimit == 0 {
		c.UpgradeLimit = DefaultUpgradeLimit
	}
	if c.UpgradeWindow == 0 {
		c.UpgradeWindow = DefaultUpgradeWindow
	}
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if c.SocketLifetime == 0 {
		c.SocketLifetime = DefaultSocketLifetime
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.Faults.Upgrade5xxStatus == 0 {
		c.Faults.Upgrade5xxStatus = 503
	}
	if c.Faults.UsageLimitPlan == "" {
		c.Faults.UsageLimitPlan = DefaultUsageLimitPlan
	}
	c.Quota = c.Quota.withDefaults()
	accept := make(map[string]string, len(c.AcceptTokens))
	for k, v := range c.AcceptTokens {
		accept[k] = v
	}
	c.AcceptTokens = accept
	return c
}

// Duration is a time.Duration that reads and writes JSON as a Go duration
// string ("250ms", "10s"); it also reads a number of nanoseconds.
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a Go duration string or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q is invalid; want Go syntax such as 250ms or 10s", s)
		}
		*d = Duration(v)
		return nil
	}
	var n int64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("duration %s is invalid; want a string such as \"250ms\" or integer nanoseconds", b)
	}
	*d = Duration(n)
	return nil
}

// ConfigPatch is the body of POST /sim/config: every field that is present
// replaces the running value. Durations are Go duration strings.
type ConfigPatch struct {
	UpgradeLimit     *int              `json:"upgrade_limit,omitempty"`
	UpgradeWindow    *Duration         `json:"upgrade_window,omitempty"`
	CountRejected    *bool             `json:"count_rejected,omitempty"`
	InstantLimit     *int              `json:"instant_limit,omitempty"`
	MaxOpenSockets   *int              `json:"max_open_sockets,omitempty"`
	AcceptTokens     map[string]string `json:"accept_tokens,omitempty"` // added to the accepted tokens
	MaxFrameBytes    *int64            `json:"max_frame_bytes,omitempty"`
	SocketLifetime   *Duration         `json:"socket_lifetime,omitempty"`
	DeltaInterval    *Duration         `json:"delta_interval,omitempty"`
	TokenTTL         *Duration         `json:"token_ttl,omitempty"` // needs Config.Auth
	FirstByteDelay   *Duration         `json:"first_byte_delay,omitempty"`
	InterEventDelay  *Duration         `json:"inter_event_delay,omitempty"`
	CloseAfterEvents *int              `json:"close_after_events,omitempty"`
	Upgrade5xxShare  *float64          `json:"upgrade_5xx_share,omitempty"`
	Upgrade5xxStatus *int              `json:"upgrade_5xx_status,omitempty"`
	Stall            *bool             `json:"stall,omitempty"`
	RetryAfter403    *Duration         `json:"retry_after_403,omitempty"`
	// FailResponses "" turns the fault off.
	FailResponses *string `json:"fail_responses,omitempty"`
	// UsageLimitResetsIn "0s" lifts the limit; a positive value starts a
	// new one that resets that long after this POST.
	UsageLimitResetsIn *Duration `json:"usage_limit_resets_in,omitempty"`
	UsageLimitPlan     *string   `json:"usage_limit_plan,omitempty"`
}

// apply returns c changed by p, validated; c is not modified. A bad value
// is named by its key.
func (p ConfigPatch) apply(c Config) (Config, error) {
	if err := p.check(); err != nil {
		return c, err
	}
	setD := func(dst *time.Duration, v *Duration) {
		if v != nil {
			*dst = time.Duration(*v)
		}
	}
	if p.UpgradeLimit != nil {
		c.UpgradeLimit = *p.UpgradeLimit
		if c.UpgradeLimit == 0 {
			return c, errors.New("upgrade_limit 0 is invalid; want 1 or more")
		}
	}
	setD(&c.UpgradeWindow, p.UpgradeWindow)
	if p.UpgradeWindow != nil && *p.UpgradeWindow <= 0 {
		return c, fmt.Errorf("upgrade_window %v is invalid; want a positive duration", time.Duration(*p.UpgradeWindow))
	}
	if p.CountRejected != nil {
		c.CountRejected = *p.CountRejected
	}
	if p.InstantLimit != nil {
		c.InstantLimit = *p.InstantLimit
	}
	if p.MaxOpenSockets != nil {
		c.MaxOpenSockets = *p.MaxOpenSockets
	}
	if len(p.AcceptTokens) > 0 {
		accept := make(map[string]string, len(c.AcceptTokens)+len(p.AcceptTokens))
		for k, v := range c.AcceptTokens {
			accept[k] = v
		}
		for k, v := range p.AcceptTokens {
			accept[k] = v
		}
		c.AcceptTokens = accept
	}
	if p.MaxFrameBytes != nil {
		c.MaxFrameBytes = *p.MaxFrameBytes
		if c.MaxFrameBytes == 0 {
			return c, errors.New("max_frame_bytes 0 is invalid; want 1 or more")
		}
	}
	setD(&c.SocketLifetime, p.SocketLifetime)
	if p.SocketLifetime != nil && *p.SocketLifetime <= 0 {
		return c, fmt.Errorf("socket_lifetime %v is invalid; want a positive duration", time.Duration(*p.SocketLifetime))
	}
	setD(&c.DeltaInterval, p.DeltaInterval)
	setD(&c.Faults.FirstByteDelay, p.FirstByteDelay)
	setD(&c.Faults.InterEventDelay, p.InterEventDelay)
	if p.CloseAfterEvents != nil {
		c.Faults.CloseAfterEvents = *p.CloseAfterEvents
	}
	if p.Upgrade5xxShare != nil {
		c.Faults.Upgrade5xxShare = *p.Upgrade5xxShare
	}
	if p.Upgrade5xxStatus != nil {
		c.Faults.Upgrade5xxStatus = *p.Upgrade5xxStatus
		if c.Faults.Upgrade5xxStatus == 0 {
			c.Faults.Upgrade5xxStatus = 503
		}
	}
	if p.Stall != nil {
		c.Faults.Stall = *p.Stall
	}
	setD(&c.Faults.RetryAfter403, p.RetryAfter403)
	if p.FailResponses != nil {
		c.Faults.FailResponses = *p.FailResponses
	}
	setD(&c.Faults.UsageLimitResetsIn, p.UsageLimitResetsIn)
	if p.UsageLimitPlan != nil {
		c.Faults.UsageLimitPlan = *p.UsageLimitPlan
		if c.Faults.UsageLimitPlan == "" {
			c.Faults.UsageLimitPlan = DefaultUsageLimitPlan
		}
	}
	if p.TokenTTL != nil {
		if c.Auth == nil {
			return c, errors.New("token_ttl needs the OAuth emulator, which this server runs without")
		}
		if *p.TokenTTL < Duration(time.Second) {
			return c, fmt.Errorf("token_ttl %v is invalid; want at least 1s", time.Duration(*p.TokenTTL))
		}
	}
	if err := c.validate(); err != nil {
		return c, err
	}
	return c, nil
}
