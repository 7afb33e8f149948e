package accounts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/internal/codexauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Source supplies the credentials of the accounts a data plane serves,
// each named by its account key (account.Key of the ChatGPT account id).
// [Files] serves auth.json files; the control plane's credential broker
// (dataplane/control) is the other. Implementations are safe for
// concurrent use.
type Source interface {
	// Accounts returns the keys of the accounts served, in a stable
	// order, or an error saying why none can be: an *UnavailableError
	// (try again soon) or an error wrapping ErrLoginRequired.
	Accounts(ctx context.Context) ([]string, error)
	// Credential returns the account's current credential.
	Credential(ctx context.Context, key string) (codexauth.Credential, error)
	// Rejected returns a credential with another access token after the
	// upstream refused token (a 401): one forced refresh. An error wraps
	// ErrLoginRequired when someone must sign in again.
	Rejected(ctx context.Context, key string, token codexauth.Secret) (codexauth.Credential, error)
}

// Heads is what the router asks of the connection pool: which account
// holds the idle head a conversation continues, and dropping that head
// when the conversation moves. *pool.Pool implements it.
type Heads interface {
	Holder(part pool.Partition, items [][]byte, accounts []string) (string, bool)
	Forget(part pool.Partition, items [][]byte) bool
}

// Reporter takes an account's plan usage for the control plane's quota
// view. The control-plane client (dataplane/control) implements it.
type Reporter interface {
	ReportRateLimits(rl *controlplanev1.RateLimits)
}

// Standing says whether this data plane may serve turns at all: Refused
// returns an error while the control plane refuses its agent credential
// (revoked, or never valid), nil otherwise. The control-plane client
// (dataplane/control) implements it.
type Standing interface {
	Refused() error
}

// ErrNone is returned by Route when the source serves no account.
var ErrNone = errors.New("no upstream account is known yet")

// ErrAllDown is what Route finds when no account is at its usage limit but
// every one's sign-in is unusable; Route answers with that sign-in's own
// error, which wraps ErrLoginRequired.
var ErrAllDown = errors.New("no upstream account has a usable sign-in")

// AllLimitedError is Route's answer when every account is at its usage
// limit: Account resets first, at ResetsAt.
type AllLimitedError struct {
	Account  string // its key
	ResetsAt time.Time
	// ResetsIn is ResetsAt less the router's clock at the Route.
	ResetsIn time.Duration
}

// AllLimited returns the account whose reset comes first, and when.
func (e *AllLimitedError) AllLimited() (account string, resetsAt time.Time, resetsIn time.Duration) {
	return e.Account, e.ResetsAt, e.ResetsIn
}

func (e *AllLimitedError) Error() string {
	return fmt.Sprintf("every upstream account is at its usage limit; the first reset is %s's at %s",
		e.Account, e.ResetsAt.UTC().Format(time.RFC3339))
}

// Defaults of the router.
const (
	// DownWait is how long an account whose sign-in needs a login takes no
	// new conversation before it is tried again.
	DownWait = time.Minute
	// DefaultUsageLimitHold is Config.UsageLimitHold's default: how long
	// an account at its usage limit takes no new conversation when the
	// backend did not say when the limit resets.
	DefaultUsageLimitHold = 5 * time.Minute
	// MinUsageLimitHold and MaxUsageLimitHold bound Config.UsageLimitHold.
	MinUsageLimitHold = 10 * time.Second
	MaxUsageLimitHold = 24 * time.Hour
	// UsageLimitHoldRange is the range as errors name it.
	UsageLimitHoldRange = "10s..24h"
)

// Config configures NewRouter. NewRouter copies it.
type Config struct {
	// Source supplies the accounts and their credentials. (Required)
	Source Source
	// Accounts are the keys Source serves, in its order, when they are
	// fixed for the router's life (auth.json files: Files.Accounts at
	// start): Route chooses among them and never asks Source.Accounts.
	// (Optional; default none: Route asks Source.Accounts on every turn,
	// as the broker's accounts change)
	Accounts []string
	// Reporter receives each account's plan usage, at most once a second
	// unless it changed. (Optional)
	Reporter Reporter
	// Fleet is the fleet's plan usage, which a new conversation's choice
	// uses for an account the router has no newer figures of (fleet.go).
	// (Optional; default none: each data plane's own figures)
	Fleet FleetView
	// Standing, when set, is asked before every turn: while it refuses,
	// Route answers its error and no turn runs, not even one on a socket
	// the pool holds. (Optional; default none)
	Standing Standing
	// Clock is the time source. (Optional; default time.Now)
	Clock func() time.Time
	// Logger receives the moves and skipped sign-ins; never an account id
	// or a token. (Optional; default discards)
	Logger *slog.Logger
	// Registerer receives clodex_dataplane_account_moves_total. (Optional)
	Registerer prometheus.Registerer
	// UsageLimitHold is how long an account at its usage limit takes no
	// new conversation when the backend's usage-limit error gives no reset
	// time (neither resets_at nor resets_in_seconds). (Optional; default
	// DefaultUsageLimitHold, 5 minutes; MinUsageLimitHold..MaxUsageLimitHold)
	UsageLimitHold time.Duration
}

// state is what the router knows of one account.
type state struct {
	limits       RateLimits
	limitedUntil time.Time // at its usage limit until then; zero: not known limited
	downUntil    time.Time // its sign-in is unusable until then
	reported     RateLimits
	reportedAt   time.Time // when limits were last reported; zero: never
	limitsAt     time.Time // when limits were read; zero: never
}

// Router chooses the account of every turn and learns each account's
// limits from the frames its sockets read. It is safe for concurrent use.
type Router struct {
	src      Source
	fixed    []string // Config.Accounts; nil: ask src on every turn
	report   Reporter
	fleet    FleetView // Config.Fleet; nil: none
	standing Standing  // Config.Standing; nil: always in good standing
	now      func() time.Time
	log      *slog.Logger
	moves    prometheus.Counter
	hold     time.Duration // Config.UsageLimitHold

	mu    sync.Mutex // guards the following fields
	state map[string]*state
	next  int // round-robin cursor into the source's order
}

// NewRouter checks cfg and returns a Router.
func NewRouter(cfg Config) (*Router, error) {
	if cfg.Source == nil {
		return nil, errors.New("accounts router: field Source is required")
	}
	r := &Router{src: cfg.Source, report: cfg.Reporter, fleet: cfg.Fleet, standing: cfg.Standing, now: cfg.Clock, log: cfg.Logger, hold: cfg.UsageLimitHold, state: map[string]*state{}}
	switch {
	case r.hold == 0:
		r.hold = DefaultUsageLimitHold
	case r.hold < MinUsageLimitHold || r.hold > MaxUsageLimitHold:
		return nil, fmt.Errorf("accounts router: UsageLimitHold %v is out of range; allowed %s", r.hold, UsageLimitHoldRange)
	}
	if len(cfg.Accounts) > 0 {
		r.fixed = slices.Clone(cfg.Accounts)
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.log = r.log.With("component", "dataplane/accounts")
	r.moves = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clodex_dataplane_account_moves_total",
		Help: "Conversations moved to another upstream account because theirs was at its usage limit (each costs one full resend).",
	})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(r.moves); err != nil {
			return nil, fmt.Errorf("accounts router: register metrics: %w", err)
		}
	}
	return r, nil
}

// Route returns the key of the account a turn of the conversation items
// runs on, in part's model, effort and prompt cache key (part.Account is
// ignored). The turn's member (MemberFrom) and the account its request
// asks for (AccountFrom) narrow the choice first (pins.go): a request's
// account or the member's pin is the turn's unless it is at its usage
// limit (*ChosenLimitedError), and an account the turn may not use is a
// *NotAllowedError. With one account it is that one. With several, a
// conversation whose idle head lives on an account keeps it unless the
// account is at its usage limit; a new conversation, or one whose account
// is limited, goes to the account with the most headroom in its tightest
// window (ties round robin), skipping accounts at their limit and those
// whose sign-in needs a login. While Config.Standing refuses, Route
// returns its error before anything else. A move drops the head on the old account
// (the turn resends the whole conversation), is counted in
// clodex_dataplane_account_moves_total and logged once. When every account
// is at its limit Route returns an *AllLimitedError; the source's errors
// (no account yet, a dead sign-in) are returned as they are. The accounts
// are Config.Accounts, else the source's answer.
func (r *Router) Route(ctx context.Context, heads Heads, part pool.Partition, items [][]byte) (string, error) {
	if r.standing != nil {
		if err := r.standing.Refused(); err != nil {
			return "", err
		}
	}
	keys := r.fixed
	if keys == nil {
		var err error
		if keys, err = r.src.Accounts(ctx); err != nil {
			return "", err
		}
	}
	// The turn's member and request narrow the choice (pins.go).
	keys, forced, pinned, err := narrow(ctx, keys)
	if err != nil {
		return "", err
	}
	if forced != "" {
		return r.routeForced(ctx, heads, part, items, keys, forced, pinned)
	}
	switch len(keys) {
	case 0:
		return "", ErrNone
	case 1:
		return keys[0], nil
	}
	holder, held := heads.Holder(part, items, keys)
	var until time.Time
	if held {
		var limited bool
		if until, limited = r.LimitedUntil(holder); !limited {
			return holder, nil
		}
	}
	var lastDown error
	for range len(keys) {
		key, err := r.pick(keys)
		if errors.Is(err, ErrAllDown) && lastDown != nil {
			return "", lastDown // says why the sign-in is unusable
		}
		if err != nil {
			return "", err
		}
		_, err = r.src.Credential(ctx, key)
		if err == nil {
			if held {
				old := part
				old.Account = holder
				heads.Forget(old, items)
				r.moves.Inc()
				r.log.InfoContext(ctx, "conversation moves to another account: its account is at its usage limit; the whole conversation is resent",
					"from", holder, "to", key, "limited_until", until.UTC().Format(time.RFC3339), "items", len(items))
			}
			return key, nil
		}
		if !errors.Is(err, ErrLoginRequired) {
			return "", err
		}
		// A sign-in that needs an operator: try the next account.
		lastDown = err
		r.down(key, DownWait)
		r.log.WarnContext(ctx, "account skipped for new conversations: its sign-in needs a login", "account", key, "for", DownWait)
	}
	if lastDown != nil {
		return "", lastDown
	}
	return "", ErrAllDown
}

// Credential returns the current credential of the account with key (the
// pool's dial asks it for every new socket).
func (r *Router) Credential(ctx context.Context, key string) (codexauth.Credential, error) {
	return r.src.Credential(ctx, key)
}

// Rejected asks the source for one refresh of an access token the
// upstream refused on the account with key.
func (r *Router) Rejected(ctx context.Context, key string, token codexauth.Secret) (codexauth.Credential, error) {
	return r.src.Rejected(ctx, key, token)
}

// pick returns the account for a new conversation among keys (the
// source's order): among those not at their usage limit and not down, one
// with the most headroom; ties are broken round robin. It returns an
// *AllLimitedError when none is usable and some are at their limit, else
// ErrAllDown.
func (r *Router) pick(keys []string) (string, error) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(keys)
	best, bestHead := -1, -1.0
	var first *AllLimitedError
	for i := range n {
		j := (r.next + i) % n
		st := r.stateLocked(keys[j])
		lim, until := r.limitsLocked(keys[j], st)
		if now.Before(until) {
			if first == nil || until.Before(first.ResetsAt) {
				first = &AllLimitedError{Account: keys[j], ResetsAt: until, ResetsIn: until.Sub(now)}
			}
			continue
		}
		if now.Before(st.downUntil) {
			continue
		}
		if h := lim.Headroom(now); h > bestHead {
			best, bestHead = j, h
		}
	}
	if best < 0 {
		if first == nil {
			return "", ErrAllDown
		}
		return "", first
	}
	r.next = (best + 1) % n
	return keys[best], nil
}

func (r *Router) stateLocked(key string) *state {
	st, ok := r.state[key]
	if !ok {
		st = &state{}
		r.state[key] = st
	}
	return st
}

// LimitedUntil reports whether the account with key is known to be at its
// usage limit now, and until when.
func (r *Router) LimitedUntil(key string) (time.Time, bool) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.state[key]
	if !ok || !now.Before(st.limitedUntil) {
		return time.Time{}, false
	}
	return st.limitedUntil, true
}

// down marks the account's sign-in unusable for d: Route skips it for new
// conversations meanwhile, without counting it as limited.
func (r *Router) down(key string, d time.Duration) {
	until := r.now().Add(d)
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.stateLocked(key); until.After(st.downUntil) {
		st.downUntil = until
	}
}

// Observe reads one upstream frame of a socket of the account with key:
// a codex.rate_limits event records the account's plan usage (and, at its
// limit, marks it limited until the latest reset among its exhausted
// windows), a usage-limit error marks it limited until its reset (for
// Config.UsageLimitHold when it names none); either
// is passed to the Reporter. Every other frame is left alone. It is the
// pool's frame hook: it runs on the socket's reader and does not block.
func (r *Router) Observe(key string, frame []byte) {
	now := r.now()
	rl, ok := ParseRateLimits(frame, now)
	if !ok {
		// A usage-limit error says the account is at its limit; the
		// windows last reported stay as they were.
		if !bytes.Contains(frame, usageLimitCode) {
			return
		}
		e := retry.ClassifyFrame(frame, false)
		if e == nil || !e.UsageLimit {
			return
		}
		resets := e.ResetsAt
		if resets.IsZero() && e.ResetsIn > 0 {
			resets = now.Add(e.ResetsIn)
		}
		if resets.IsZero() {
			resets = now.Add(r.hold)
		}
		rl = RateLimits{LimitReached: true}
		r.limited(key, resets)
	}
	r.observe(key, rl, ok, now)
}

// observe records rl, read at now, as the account's latest plan usage
// when seen is true (a codex.rate_limits event; else rl only says the
// limit was reached) and reports it unless the same report went out less
// than a second ago.
func (r *Router) observe(key string, rl RateLimits, seen bool, now time.Time) {
	r.mu.Lock()
	st := r.stateLocked(key)
	if seen {
		st.limits, st.limitsAt = rl, now
		if until := rl.exhaustedUntil(); until.After(st.limitedUntil) {
			st.limitedUntil = until
		}
	}
	due := st.reportedAt.IsZero() || now.Sub(st.reportedAt) >= time.Second || !sameLimits(st.reported, rl)
	if due {
		st.reported, st.reportedAt = rl, now
	}
	r.mu.Unlock()
	if due && r.report != nil {
		r.report.ReportRateLimits(rl.message(key, now))
	}
}

// usageLimitCode is the error code Observe looks for before it classifies
// a frame.
var usageLimitCode = []byte("usage_limit_reached")

// limited marks the account at its usage limit until resetsAt; a later
// reset already known is kept.
func (r *Router) limited(key string, resetsAt time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st := r.stateLocked(key); resetsAt.After(st.limitedUntil) {
		st.limitedUntil = resetsAt
	}
}

// RateLimits is an account's plan usage as the backend reports it in a
// codex.rate_limits side event (docs: backend events): the plan and each
// usage window.
type RateLimits struct {
	// PlanType is the plan's name ("plus", "pro", ...), or "".
	PlanType string
	// LimitReached is true when the backend says the account is at a
	// usage limit (rate_limits.limit_reached, or allowed false).
	LimitReached bool
	// Windows are the reported windows, primary first; a null window is
	// left out.
	Windows []RateLimitWindow
}

// RateLimitWindow is one usage window.
type RateLimitWindow struct {
	// Name is "primary" (the 5-hour window) or "secondary" (the weekly
	// one).
	Name string
	// UsedPercent is the share of the window used, 0..100 (the backend
	// may report more at the limit; it is kept, clamped to 0..1000).
	UsedPercent float64
	// Window is the window's length (window_minutes).
	Window time.Duration
	// ResetsAt is when the window resets: reset_at (Unix seconds), else
	// now + reset_after_seconds; zero when neither is given.
	ResetsAt time.Time
}

// rateLimitsType is the side event's type and the prefix ParseRateLimits
// looks for before it decodes anything.
var rateLimitsType = []byte(`"codex.rate_limits"`)

// ParseRateLimits reads a codex.rate_limits event (the JSON text of one
// upstream frame) read at now. It reports false for any other frame, and
// for a rate-limits event without a readable rate_limits object; fields
// of the wrong type are left out rather than failing the event, which is
// informational.
func ParseRateLimits(frame []byte, now time.Time) (RateLimits, bool) {
	if !bytes.Contains(frame, rateLimitsType) {
		return RateLimits{}, false
	}
	var ev struct {
		Type       string          `json:"type"`
		PlanType   json.RawMessage `json:"plan_type"`
		RateLimits *struct {
			Allowed      *bool                      `json:"allowed"`
			LimitReached *bool                      `json:"limit_reached"`
			Primary      map[string]json.RawMessage `json:"primary"`
			Secondary    map[string]json.RawMessage `json:"secondary"`
		} `json:"rate_limits"`
	}
	if json.Unmarshal(frame, &ev) != nil || ev.Type != "codex.rate_limits" || ev.RateLimits == nil {
		return RateLimits{}, false
	}
	var rl RateLimits
	_ = json.Unmarshal(ev.PlanType, &rl.PlanType)
	lim := ev.RateLimits
	rl.LimitReached = lim.LimitReached != nil && *lim.LimitReached || lim.Allowed != nil && !*lim.Allowed
	for _, w := range []struct {
		name string
		obj  map[string]json.RawMessage
	}{{"primary", lim.Primary}, {"secondary", lim.Secondary}} {
		if w.obj == nil {
			continue
		}
		win := RateLimitWindow{Name: w.name}
		if v, ok := jsonNumber(w.obj["used_percent"]); ok {
			win.UsedPercent = min(max(v, 0), 1000)
		}
		if v, ok := jsonNumber(w.obj["window_minutes"]); ok && v > 0 && v <= 366*24*60 {
			win.Window = time.Duration(v * float64(time.Minute))
		}
		if v, ok := jsonNumber(w.obj["reset_at"]); ok && v > 0 && v < 1e11 {
			win.ResetsAt = time.Unix(int64(v), 0)
		} else if v, ok := jsonNumber(w.obj["reset_after_seconds"]); ok && v >= 0 && v <= retry.MaxResetsIn.Seconds() {
			win.ResetsAt = now.Add(time.Duration(v * float64(time.Second))).Truncate(time.Second)
		}
		rl.Windows = append(rl.Windows, win)
	}
	return rl, true
}

// jsonNumber reads a finite JSON number.
func jsonNumber(raw json.RawMessage) (float64, bool) {
	var v float64
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// Headroom is the share of the account's tightest window still free,
// 0..100: 100 minus the highest used percent among the windows not yet
// reset at now (a window past its reset counts as unused). An account at
// a usage limit has none; one without windows has 100.
func (rl RateLimits) Headroom(now time.Time) float64 {
	if rl.LimitReached {
		return 0
	}
	used := 0.0
	for _, w := range rl.Windows {
		if !w.ResetsAt.IsZero() && !now.Before(w.ResetsAt) {
			continue
		}
		used = max(used, w.UsedPercent)
	}
	return max(100-used, 0)
}

// exhaustedUntil is, for rate limits that say the limit is reached, the
// latest reset among the exhausted windows; zero otherwise or when none is
// known.
func (rl RateLimits) exhaustedUntil() time.Time {
	var until time.Time
	if !rl.LimitReached {
		return until
	}
	for _, w := range rl.Windows {
		if w.UsedPercent >= 100 && w.ResetsAt.After(until) {
			until = w.ResetsAt
		}
	}
	return until
}

// message is the report of rl for the account with key, read at now.
func (rl RateLimits) message(key string, now time.Time) *controlplanev1.RateLimits {
	msg := &controlplanev1.RateLimits{Account: key, PlanType: rl.PlanType, LimitReached: rl.LimitReached, AtUnixMs: now.UnixMilli()}
	for _, w := range rl.Windows {
		qw := &controlplanev1.QuotaWindow{Name: w.Name, UsedPercent: w.UsedPercent, WindowMinutes: int32(w.Window / time.Minute)}
		if !w.ResetsAt.IsZero() {
			qw.ResetsAtUnixMs = w.ResetsAt.UnixMilli()
		}
		msg.Windows = append(msg.Windows, qw)
	}
	return msg
}

// sameLimits reports whether two reports say the same thing (a reset
// computed from reset_after_seconds may move by a second).
func sameLimits(a, b RateLimits) bool {
	return a.PlanType == b.PlanType && a.LimitReached == b.LimitReached &&
		slices.EqualFunc(a.Windows, b.Windows, func(x, y RateLimitWindow) bool {
			d := x.ResetsAt.Sub(y.ResetsAt)
			return x.Name == y.Name && x.UsedPercent == y.UsedPercent && x.Window == y.Window && d >= -time.Second && d <= time.Second
		})
}
