package codexsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// The JSON form of the running configuration: GET /sim/config writes one
// flat object whose keys are the ones POST /sim/config takes (a
// ConfigPatch's), plus a few read-only facts; POST names every key it
// refuses and what the key wants, never a Go type.

// configView is the JSON form of the running configuration (GET
// /sim/config): the ConfigPatch keys with their running values, and the
// read-only keys of readOnlyKeys.
type configView struct {
	UpgradeLimit     int       `json:"upgrade_limit"`
	UpgradeWindow    Duration  `json:"upgrade_window"`
	CountRejected    bool      `json:"count_rejected"`
	InstantLimit     int       `json:"instant_limit"`
	MaxOpenSockets   int       `json:"max_open_sockets"`
	MaxFrameBytes    int64     `json:"max_frame_bytes"`
	SocketLifetime   Duration  `json:"socket_lifetime"`
	DeltaInterval    Duration  `json:"delta_interval"`
	TokenTTL         *Duration `json:"token_ttl,omitempty"` // with the OAuth emulator
	FirstByteDelay   Duration  `json:"first_byte_delay"`
	InterEventDelay  Duration  `json:"inter_event_delay"`
	CloseAfterEvents int       `json:"close_after_events"`
	Upgrade5xxShare  float64   `json:"upgrade_5xx_share"`
	Upgrade5xxStatus int       `json:"upgrade_5xx_status"`
	Stall            bool      `json:"stall"`
	RetryAfter403    Duration  `json:"retry_after_403"`
	FailResponses    string    `json:"fail_responses"`
	// UsageLimitResetsIn is the time left until the usage limit resets
	// (0s: no limit); UsageLimitResetsAt the reset in Unix seconds (0: no
	// limit).
	UsageLimitResetsIn Duration `json:"usage_limit_resets_in"`
	UsageLimitResetsAt int64    `json:"usage_limit_resets_at"`
	UsageLimitPlan     string   `json:"usage_limit_plan"`
	// AcceptedTokens is how many tokens accept_tokens holds; the tokens
	// are secrets.
	AcceptedTokens int  `json:"accepted_tokens"`
	OAuth          bool `json:"oauth"`
}

// readOnlyKeys are the keys GET shows that POST cannot change.
var readOnlyKeys = map[string]string{
	"accepted_tokens":       "how many tokens are accepted; add some with accept_tokens",
	"oauth":                 "whether the OAuth emulator runs; set at start",
	"usage_limit_resets_at": "when the usage limit resets; set usage_limit_resets_in",
}

// viewOf renders c; usageReset is when the running usage limit resets
// (zero: none), now the emulator's time, and tokenTTL the OAuth emulator's
// access-token lifetime (0: no emulator).
func viewOf(c Config, usageReset, now time.Time, tokenTTL time.Duration) configView {
	v := configView{
		UpgradeLimit:     c.UpgradeLimit,
		UpgradeWindow:    Duration(c.UpgradeWindow),
		CountRejected:    c.CountRejected,
		InstantLimit:     c.InstantLimit,
		MaxOpenSockets:   c.MaxOpenSockets,
		MaxFrameBytes:    c.MaxFrameBytes,
		SocketLifetime:   Duration(c.SocketLifetime),
		DeltaInterval:    Duration(c.DeltaInterval),
		FirstByteDelay:   Duration(c.Faults.FirstByteDelay),
		InterEventDelay:  Duration(c.Faults.InterEventDelay),
		CloseAfterEvents: c.Faults.CloseAfterEvents,
		Upgrade5xxShare:  c.Faults.Upgrade5xxShare,
		Upgrade5xxStatus: c.Faults.Upgrade5xxStatus,
		Stall:            c.Faults.Stall,
		RetryAfter403:    Duration(c.Faults.RetryAfter403),
		FailResponses:    c.Faults.FailResponses,
		UsageLimitPlan:   c.Faults.UsageLimitPlan,
		AcceptedTokens:   len(c.AcceptTokens),
		OAuth:            c.Auth != nil,
	}
	if c.Auth != nil {
		ttl := Duration(tokenTTL)
		v.TokenTTL = &ttl
	}
	if left := usageReset.Sub(now); !usageReset.IsZero() && left > 0 {
		v.UsageLimitResetsIn = Duration(left.Round(time.Second))
		v.UsageLimitResetsAt = usageReset.Unix()
	}
	return v
}

// patchKeys maps each key of a ConfigPatch to its field index.
var patchKeys = func() map[string]int {
	m := map[string]int{}
	t := reflect.TypeFor[ConfigPatch]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		m[name] = i
	}
	return m
}()

// decodePatch reads the body of POST /sim/config. It names every key it
// refuses: unknown ones (with the keys allowed), read-only ones, and
// values of the wrong kind (with the kind the key takes).
func decodePatch(body []byte) (ConfigPatch, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&raw); err != nil || raw == nil || dec.More() {
		return ConfigPatch{}, errors.New(`the body is not one JSON object of settings; send, for example, {"stall": true, "upgrade_window": "10s"} (GET /sim/config shows every key)`)
	}
	var p ConfigPatch
	pv := reflect.ValueOf(&p).Elem()
	var errs []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range raw {
			if !yield(k) {
				return
			}
		}
	}) {
		i, ok := patchKeys[k]
		switch {
		case ok:
			f := pv.Field(i)
			dst := reflect.New(f.Type())
			if err := json.Unmarshal(raw[k], dst.Interface()); err != nil {
				errs = append(errs, fmt.Sprintf("%s: want %s, got %s", k, kindOf(f.Type()), clip(string(raw[k]), 40)))
				continue
			}
			f.Set(dst.Elem())
		case readOnlyKeys[k] != "":
			errs = append(errs, fmt.Sprintf("%s is read-only (%s)", k, readOnlyKeys[k]))
		default:
			allowed := slices.Sorted(func(yield func(string) bool) {
				for k := range patchKeys {
					if !yield(k) {
						return
					}
				}
			})
			errs = append(errs, fmt.Sprintf("unknown key %q; allowed: %s", clip(k, 40), strings.Join(allowed, ", ")))
		}
	}
	if len(errs) > 0 {
		return ConfigPatch{}, errors.New(strings.Join(errs, "; "))
	}
	return p, nil
}

// kindOf says in words what a ConfigPatch field takes.
func kindOf(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == reflect.TypeFor[Duration]():
		return `a duration such as "10s"`
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Int, t.Kind() == reflect.Int64:
		return "an integer"
	case t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() == reflect.Map:
		return `an object of token to account id, such as {"tok": "acct-1"}`
	}
	return "a value of the documented kind"
}

// check names, by key, each value of p the emulator cannot run with.
func (p ConfigPatch) check() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	if v := p.UpgradeLimit; v != nil && *v < 1 {
		bad("upgrade_limit %d is invalid; want 1 or more", *v)
	}
	if v := p.InstantLimit; v != nil && *v < 0 {
		bad("instant_limit %d is invalid; want 0 (off) or more", *v)
	}
	if v := p.MaxOpenSockets; v != nil && *v < 0 {
		bad("max_open_sockets %d is invalid; want 0 (off) or more", *v)
	}
	if v := p.MaxFrameBytes; v != nil && *v < 1 {
		bad("max_frame_bytes %d is invalid; want 1 or more", *v)
	}
	for _, d := range []struct {
		key      string
		v        *Duration
		positive bool
	}{
		{"upgrade_window", p.UpgradeWindow, true}, {"socket_lifetime", p.SocketLifetime, true},
		{"delta_interval", p.DeltaInterval, false}, {"first_byte_delay", p.FirstByteDelay, false},
		{"inter_event_delay", p.InterEventDelay, false}, {"retry_after_403", p.RetryAfter403, false},
		{"usage_limit_resets_in", p.UsageLimitResetsIn, false},
	} {
		switch {
		case d.v == nil:
		case d.positive && *d.v <= 0:
			bad("%s %v is invalid; want a positive duration", d.key, time.Duration(*d.v))
		case *d.v < 0:
			bad("%s %v is invalid; want 0 (off) or a positive duration", d.key, time.Duration(*d.v))
		}
	}
	if v := p.TokenTTL; v != nil && *v < Duration(time.Second) {
		bad("token_ttl %v is invalid; want at least 1s", time.Duration(*v))
	}
	if v := p.CloseAfterEvents; v != nil && *v < 0 {
		bad("close_after_events %d is invalid; want 0 (off) or more", *v)
	}
	if v := p.Upgrade5xxShare; v != nil && !(*v >= 0 && *v <= 1) {
		bad("upgrade_5xx_share %v is invalid; want a number in [0, 1]", *v)
	}
	if v := p.Upgrade5xxStatus; v != nil && *v != 0 && (*v < 500 || *v > 599) {
		bad("upgrade_5xx_status %d is invalid; want 500-599 (0: 503)", *v)
	}
	if v := p.FailResponses; v != nil && *v != "" && !validCode(*v) {
		bad("fail_responses %q is invalid; want an error code of letters, digits, '_', '.', ':' or '-' (at most 64), or \"\" for off", clip(*v, 64))
	}
	if v := p.UsageLimitPlan; v != nil && *v != "" && !validCode(*v) {
		bad("usage_limit_plan %q is invalid; want a plan name such as plus or pro", clip(*v, 64))
	}
	for tok, acct := range p.AcceptTokens {
		if tok == "" || acct == "" {
			bad("accept_tokens has an empty token or account id; want {\"TOKEN\": \"ACCOUNT_ID\", ...}")
			break
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}
