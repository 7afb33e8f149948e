package accounts

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/internal/codexauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// keys is a Source serving fixed accounts; down lists the keys whose
// sign-in needs a login.
type keys struct {
	list []string
	down map[string]bool
}

func (k *keys) Accounts(context.Context) ([]string, error) { return k.list, nil }

func (k *keys) Credential(_ context.Context, key string) (codexauth.Credential, error) {
	if k.down[key] {
		return codexauth.Credential{}, &LoginRequiredError{Message: "log " + key + " in"}
	}
	return codexauth.Credential{AccessToken: codexauth.Secret("tok-" + key), AccountID: "id-" + key}, nil
}

func (k *keys) Rejected(ctx context.Context, key string, _ codexauth.Secret) (codexauth.Credential, error) {
	return k.Credential(ctx, key)
}

func newRouter(t *testing.T, ids ...string) (*Router, *clock, *keys) {
	t.Helper()
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	src := &keys{list: ids, down: map[string]bool{}}
	r, err := NewRouter(Config{Source: src, Clock: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return r, c, src
}

func used(pct float64, resets time.Time) RateLimits {
	return RateLimits{Windows: []RateLimitWindow{
		{Name: "primary", UsedPercent: pct, Window: 5 * time.Hour, ResetsAt: resets},
	}}
}

func picks(t *testing.T, r *Router, keys []string, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		id, err := r.pick(keys)
		if err != nil {
			t.Fatalf("pick: %v", err)
		}
		got[id]++
	}
	return got
}

func TestRouteWithoutAccounts(t *testing.T) {
	r, _, _ := newRouter(t)
	if _, err := r.Route(t.Context(), nil, part(), nil); !errors.Is(err, ErrNone) {
		t.Fatalf("Route without accounts = %v; want ErrNone", err)
	}
}

// unasked is a Source whose Accounts must not be called: the router was
// told the fixed accounts.
type unasked struct{ *keys }

func (unasked) Accounts(context.Context) ([]string, error) {
	return nil, errors.New("Accounts called; want Config.Accounts used")
}

// With Config.Accounts the router chooses among them and never asks the
// source which accounts it serves.
func TestRouteFixedAccounts(t *testing.T) {
	for _, ids := range [][]string{{"a"}, {"a", "b"}} {
		given := append([]string(nil), ids...)
		r, err := NewRouter(Config{Source: unasked{&keys{}}, Accounts: given})
		if err != nil {
			t.Fatal(err)
		}
		given[0] = "changed" // NewRouter copies the list
		got := map[string]int{}
		for range 4 {
			id, err := r.Route(t.Context(), noHeads{}, part(), nil)
			if err != nil {
				t.Fatalf("Route(accounts %v) = %v; want no error", ids, err)
			}
			got[id]++
		}
		for _, id := range ids {
			if got[id] != 4/len(ids) {
				t.Fatalf("Route(accounts %v) chose %v; want %d each", ids, got, 4/len(ids))
			}
		}
	}
}

func TestUnknownHeadroomSpreadsRoundRobin(t *testing.T) {
	r, _, _ := newRouter(t, "a", "b", "c")
	got := picks(t, r, []string{"a", "b", "c"}, 9)
	for _, id := range []string{"a", "b", "c"} {
		if got[id] != 3 {
			t.Fatalf("picks = %v; want 3 each", got)
		}
	}
}

func TestMostHeadroomWins(t *testing.T) {
	ids := []string{"a", "b"}
	r, c, _ := newRouter(t, ids...)
	r.observe("a", used(40, c.t.Add(time.Hour)), true, c.t)
	r.observe("b", used(10, c.t.Add(time.Hour)), true, c.t)
	if got := picks(t, r, ids, 4); got["b"] != 4 {
		t.Fatalf("picks = %v; want all on b (90%% headroom against 60%%)", got)
	}
	// The tightest window counts: b's weekly window is nearly used up.
	rl := used(10, c.t.Add(time.Hour))
	rl.Windows = append(rl.Windows, RateLimitWindow{Name: "secondary", UsedPercent: 95, ResetsAt: c.t.Add(72 * time.Hour)})
	r.observe("b", rl, true, c.t)
	if got := picks(t, r, ids, 2); got["a"] != 2 {
		t.Fatalf("picks = %v; want all on a (b's tightest window has 5%% left)", got)
	}
	// Once a's window resets it counts as unused again.
	c.t = c.t.Add(2 * time.Hour)
	r.observe("b", used(10, c.t.Add(time.Hour)), true, c.t)
	if got := picks(t, r, ids, 4); got["a"] != 4 {
		t.Fatalf("picks after a's reset = %v; want all on a (100%% against 90%%)", got)
	}
}

func TestLimitedSkippedUntilReset(t *testing.T) {
	ids := []string{"a", "b"}
	r, c, _ := newRouter(t, ids...)
	reset := c.t.Add(10 * time.Minute)
	r.limited("a", reset)
	if until, ok := r.LimitedUntil("a"); !ok || !until.Equal(reset) {
		t.Fatalf("LimitedUntil(a) = %v, %v; want %v, true", until, ok, reset)
	}
	if got := picks(t, r, ids, 4); got["b"] != 4 {
		t.Fatalf("picks = %v; want all on b while a is limited", got)
	}
	c.t = reset
	if _, ok := r.LimitedUntil("a"); ok {
		t.Fatal("a still limited at its reset")
	}
	if got := picks(t, r, ids, 4); got["a"] != 2 || got["b"] != 2 {
		t.Fatalf("picks after the reset = %v; want 2 each", got)
	}
}

func TestAllLimitedNamesFirstReset(t *testing.T) {
	ids := []string{"a", "b", "c"}
	r, c, _ := newRouter(t, ids...)
	r.limited("a", c.t.Add(30*time.Minute))
	r.limited("b", c.t.Add(5*time.Minute))
	r.observe("c", RateLimits{LimitReached: true, Windows: []RateLimitWindow{
		{Name: "primary", UsedPercent: 100, ResetsAt: c.t.Add(20 * time.Minute)},
	}}, true, c.t)
	_, err := r.Route(t.Context(), noHeads{}, part(), nil)
	var all *AllLimitedError
	if !errors.As(err, &all) {
		t.Fatalf("Route = %v; want *AllLimitedError", err)
	}
	if all.Account != "b" || !all.ResetsAt.Equal(c.t.Add(5*time.Minute)) || all.ResetsIn != 5*time.Minute {
		t.Fatalf("AllLimitedError = %s at %v; want b at %v", all.Account, all.ResetsAt, c.t.Add(5*time.Minute))
	}
	c.t = c.t.Add(5 * time.Minute)
	if id, err := r.Route(t.Context(), noHeads{}, part(), nil); err != nil || id != "b" {
		t.Fatalf("Route after b's reset = %q, %v; want b", id, err)
	}
}

func TestDownSkipped(t *testing.T) {
	ids := []string{"a", "b"}
	r, c, _ := newRouter(t, ids...)
	r.down("a", time.Minute)
	if got := picks(t, r, ids, 3); got["b"] != 3 {
		t.Fatalf("picks = %v; want all on b while a's sign-in is down", got)
	}
	r.down("b", time.Minute)
	if _, err := r.pick(ids); !errors.Is(err, ErrAllDown) {
		t.Fatalf("pick with every sign-in down = %v; want ErrAllDown", err)
	}
	r.limited("b", c.t.Add(time.Hour))
	var all *AllLimitedError
	if _, err := r.pick(ids); !errors.As(err, &all) || all.Account != "b" {
		t.Fatalf("pick with a down and b limited = %v; want b's usage limit", err)
	}
	c.t = c.t.Add(time.Minute)
	if id, err := r.pick(ids); err != nil || id != "a" {
		t.Fatalf("pick once a is back = %q, %v; want a", id, err)
	}
}

// A new conversation skips an account whose sign-in needs a login and
// says so when none is left.
func TestRouteSkipsDeadSignIns(t *testing.T) {
	r, c, src := newRouter(t, "a", "b")
	src.down["a"] = true
	for range 3 {
		if id, err := r.Route(t.Context(), noHeads{}, part(), nil); err != nil || id != "b" {
			t.Fatalf("Route = %q, %v; want b while a's sign-in is dead", id, err)
		}
	}
	src.down["b"] = true
	c.t = c.t.Add(DownWait)
	_, err := r.Route(t.Context(), noHeads{}, part(), nil)
	var lr *LoginRequiredError
	if !errors.As(err, &lr) || !errors.Is(err, ErrLoginRequired) {
		t.Fatalf("Route with every sign-in dead = %v; want the sign-in's LoginRequiredError", err)
	}
}

// The data plane reports an account's codex.rate_limits to the control
// plane: a changed report at once, the same one at most once a second;
// other frames are not reports.
func TestObserveReports(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var sent []*controlplanev1.RateLimits
	r, err := NewRouter(Config{Source: &keys{}, Clock: func() time.Time { return now }, Reporter: reportFunc(func(rl *controlplanev1.RateLimits) { sent = append(sent, rl) })})
	if err != nil {
		t.Fatal(err)
	}
	const key = "acct_0123456789abcdef"
	frame := func(used int) []byte {
		return []byte(`{"type":"codex.rate_limits","plan_type":"pro","rate_limits":{"allowed":true,"limit_reached":false,` +
			`"primary":{"used_percent":` + string(rune('0'+used)) + `,"window_minutes":300,"reset_after_seconds":60,"reset_at":1796140860},` +
			`"secondary":null}}`)
	}
	r.Observe(key, []byte(`{"type":"response.created","response":{"id":"r"}}`))
	r.Observe(key, frame(7))
	r.Observe(key, frame(7))
	if len(sent) != 1 {
		t.Fatalf("reports = %d, want 1 (the same figures within a second are sent once)", len(sent))
	}
	rep := sent[0]
	if rep.GetAccount() != key || rep.GetPlanType() != "pro" || rep.GetAtUnixMs() != now.UnixMilli() || len(rep.GetWindows()) != 1 {
		t.Fatalf("report = %v; want %s's pro plan, one window, read now", rep, key)
	}
	if w := rep.GetWindows()[0]; w.GetName() != "primary" || w.GetUsedPercent() != 7 || w.GetWindowMinutes() != 300 || w.GetResetsAtUnixMs() != 1796140860000 {
		t.Errorf("window = %v; want primary, 7%% of 300 min, resetting at 1796140860 s", w)
	}
	r.Observe(key, frame(8))
	now = now.Add(2 * time.Second)
	r.Observe(key, frame(8))
	if len(sent) != 3 || sent[1].GetWindows()[0].GetUsedPercent() != 8 {
		t.Fatalf("reports = %d, want 3: a change at once, the same figures again after a second", len(sent))
	}
	// A usage-limit error reports the limit reached (no windows) and
	// marks the account limited until its reset.
	r.Observe(key, []byte(`{"type":"error","status":429,"error":{"type":"usage_limit_reached","code":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"pro","resets_in_seconds":600}}`))
	if len(sent) != 4 || !sent[3].GetLimitReached() || len(sent[3].GetWindows()) != 0 {
		t.Errorf("reports = %d, last %v; want a fourth saying the limit is reached", len(sent), sent[len(sent)-1])
	}
	if until, ok := r.LimitedUntil(key); !ok || !until.Equal(now.Add(600*time.Second)) {
		t.Errorf("LimitedUntil = %v, %v; want %v, true", until, ok, now.Add(600*time.Second))
	}
}

// A usage-limit error that names no reset holds the account out for
// Config.UsageLimitHold, 5 minutes unless set; a hold out of range is
// refused, naming the range.
func TestUsageLimitWithoutResetHolds(t *testing.T) {
	noReset := []byte(`{"type":"error","status":429,"error":{"type":"usage_limit_reached","code":"usage_limit_reached","message":"The usage limit has been reached"}}`)
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		hold, want time.Duration
	}{{0, 5 * time.Minute}, {10 * time.Second, 10 * time.Second}, {90 * time.Second, 90 * time.Second}, {24 * time.Hour, 24 * time.Hour}} {
		c := &clock{t: start}
		r, err := NewRouter(Config{Source: &keys{list: []string{"a", "b"}}, Clock: c.now, UsageLimitHold: tc.hold})
		if err != nil {
			t.Fatalf("NewRouter(UsageLimitHold %v): %v", tc.hold, err)
		}
		r.Observe("a", noReset)
		if until, ok := r.LimitedUntil("a"); !ok || !until.Equal(start.Add(tc.want)) {
			t.Errorf("UsageLimitHold %v: LimitedUntil = %v, %v; want %v, true", tc.hold, until, ok, start.Add(tc.want))
		}
		c.t = start.Add(tc.want - time.Second)
		if got := picks(t, r, []string{"a", "b"}, 2); got["b"] != 2 {
			t.Errorf("UsageLimitHold %v: picks a second before the hold ends = %v; want both on b", tc.hold, got)
		}
		c.t = start.Add(tc.want)
		if _, ok := r.LimitedUntil("a"); ok {
			t.Errorf("UsageLimitHold %v: a still limited when the hold ends", tc.hold)
		}
	}
	for _, bad := range []time.Duration{-time.Second, 9 * time.Second, 25 * time.Hour} {
		_, err := NewRouter(Config{Source: &keys{}, UsageLimitHold: bad})
		if err == nil || !strings.Contains(err.Error(), "allowed 10s..24h") {
			t.Errorf("NewRouter(UsageLimitHold %v) = %v; want an error naming the range 10s..24h", bad, err)
		}
	}
}

type reportFunc func(*controlplanev1.RateLimits)

func (f reportFunc) ReportRateLimits(rl *controlplanev1.RateLimits) { f(rl) }

func part() pool.Partition {
	return pool.Partition{Model: "gpt-5-codex", Effort: "high", PromptCacheKey: "conv"}
}

// noHeads holds no conversation: every Route is a new conversation.
type noHeads struct{}

func (noHeads) Holder(pool.Partition, [][]byte, []string) (string, bool) { return "", false }
func (noHeads) Forget(pool.Partition, [][]byte) bool                     { return false }

// heldBy holds the conversation on one account and records what Route
// forgets.
type heldBy struct {
	account string
	forgot  []pool.Partition
}

func (h *heldBy) Holder(pool.Partition, [][]byte, []string) (string, bool) { return h.account, true }
func (h *heldBy) Forget(p pool.Partition, _ [][]byte) bool {
	h.forgot = append(h.forgot, p)
	return true
}

// A conversation stays on the account holding it; when that account is at
// its usage limit it moves to another, once, and its old head is dropped.
func TestRouteKeepsOrMovesAConversation(t *testing.T) {
	r, c, _ := newRouter(t, "a", "b")
	h := &heldBy{account: "a"}
	r.observe("a", used(90, c.t.Add(time.Hour)), true, c.t) // b has more headroom: a new conversation would go there
	for range 3 {
		if id, err := r.Route(t.Context(), h, part(), nil); err != nil || id != "a" {
			t.Fatalf("Route = %q, %v; want a, the account holding the conversation", id, err)
		}
	}
	if len(h.forgot) != 0 || moves(t, r) != 0 {
		t.Fatalf("forgot %v, moves %v; want nothing dropped while a is usable", h.forgot, moves(t, r))
	}
	r.limited("a", c.t.Add(time.Hour))
	id, err := r.Route(t.Context(), h, part(), nil)
	if err != nil || id != "b" {
		t.Fatalf("Route with a limited = %q, %v; want b", id, err)
	}
	want := part()
	want.Account = "a"
	if len(h.forgot) != 1 || h.forgot[0] != want || moves(t, r) != 1 {
		t.Fatalf("forgot %v, moves %v; want a's head dropped once and one move counted", h.forgot, moves(t, r))
	}
}

// moves reads clodex_dataplane_account_moves_total.
func moves(t *testing.T, r *Router) float64 {
	t.Helper()
	var m dto.Metric
	if err := r.moves.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// standing is a Standing that refuses with err (nil: in good standing).
type standing struct{ err error }

func (s *standing) Refused() error { return s.err }

// While the control plane refuses the data plane, Route answers the
// refusal for every turn, even one whose conversation holds a head, and
// asks the source nothing; once accepted again it routes as before.
func TestRouteRefusedStanding(t *testing.T) {
	refusal := errors.New("the control plane refuses this data plane's agent credential")
	st := &standing{err: refusal}
	r, err := NewRouter(Config{Source: unasked{&keys{}}, Standing: st})
	if err != nil {
		t.Fatal(err)
	}
	h := &heldBy{account: "a"}
	if id, err := r.Route(t.Context(), h, part(), nil); !errors.Is(err, refusal) || id != "" {
		t.Errorf("Route while refused = %q, %v; want the refusal", id, err)
	}
	if len(h.forgot) != 0 {
		t.Errorf("forgot %v while refused, want nothing", h.forgot)
	}
	st.err = nil
	r, err = NewRouter(Config{Source: unasked{&keys{}}, Accounts: []string{"a"}, Standing: st})
	if err != nil {
		t.Fatal(err)
	}
	if id, err := r.Route(t.Context(), h, part(), nil); err != nil || id != "a" {
		t.Errorf("Route in good standing = %q, %v; want a", id, err)
	}
}
