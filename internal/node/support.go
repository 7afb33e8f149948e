package node

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// accountCredential returns the credential of a named account (a ChatGPT
// account id) of a source that serves several.
type accountCredential func(ctx context.Context, accountID string) (codexauth.Credential, error)

// poolCredentials gives the pool each new socket's credential: its
// partition's account's, when the source serves several (byAccount) and
// the partition names one, else the source's.
func poolCredentials(src gateway.CredentialsSource, byAccount accountCredential) pool.Credentials {
	return pool.CredentialsFunc(func(ctx context.Context, accountID string) (codexauth.Credential, error) {
		if byAccount != nil && accountID != "" {
			return byAccount(ctx, accountID)
		}
		return src.Credential(ctx)
	})
}

// parseRetryAfter reads a refused upgrade's Retry-After header: whole
// seconds, at most an hour; 0 when absent or not a positive number.
func parseRetryAfter(v string) time.Duration {
	if secs, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && secs > 0 {
		return time.Duration(min(secs, 3600)) * time.Second
	}
	return 0
}

// accountSet is the account keys this data plane has served, first seen
// first. It is safe for concurrent use.
type accountSet struct {
	mu   sync.Mutex // guards the following fields
	list []string
	last string // the most recently admitted key
}

func (s *accountSet) add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = key
	if !slices.Contains(s.list, key) {
		s.list = append(s.list, key)
	}
}

// keys returns a copy of the keys (the agent's Accounts).
func (s *accountSet) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.list)
}

// current is the most recently admitted account, for the startup log.
// With one credential per data plane it is the only one.
func (s *accountSet) current() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// budgets is the turn budget per account: the latest one the control
// plane pushed for the account's key (clodexctl set-budget), else the
// environment's. It is the gateway's Config.BudgetFor.
type budgets struct {
	fallback pacing.Budget

	mu    sync.Mutex // guards byKey
	byKey map[string]pacing.Budget
}

func newBudgets(fallback pacing.Budget) *budgets {
	return &budgets{fallback: fallback, byKey: make(map[string]pacing.Budget)}
}

// set records the budget pushed for an account key.
func (b *budgets) set(key string, budget pacing.Budget) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.byKey[key] = budget
}

// forAccount returns the budget of a turn on accountID.
func (b *budgets) forAccount(accountID string) pacing.Budget {
	if accountID == "" {
		return b.fallback
	}
	key := account.Key(accountID)
	b.mu.Lock()
	defer b.mu.Unlock()
	if v, ok := b.byKey[key]; ok {
		return v
	}
	return b.fallback
}

// lockedWriter serialises writes to w: the logger, the notices and the
// diagnostics share stderr.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// rateLimitsSink reads codex.rate_limits events and passes each account's
// plan usage on: to the control plane (at most once per account per
// second unless it changed) and to the data plane's own view.
type rateLimitsSink struct {
	now    func() time.Time
	report func(*controlplanev1.RateLimits)
	seen   func(accountKey string, rl translate.RateLimits)
	// served learns each account's limits, for the choice of a new
	// conversation's account. (Optional)
	served *accounts.Set

	mu   sync.Mutex // guards last
	last map[string]sentLimits
}

type sentLimits struct {
	at time.Time
	rl translate.RateLimits
}

// accountFrame handles one upstream frame of accountID's socket.
func (s *rateLimitsSink) accountFrame(accountID string, frame []byte) {
	s.handle(account.Key(accountID), accountID, frame)
}

// frame handles one upstream frame of accountKey's socket.
func (s *rateLimitsSink) frame(accountKey string, frame []byte) { s.handle(accountKey, "", frame) }

func (s *rateLimitsSink) handle(accountKey, accountID string, frame []byte) {
	now := s.now()
	rl, ok := translate.ParseRateLimits(frame, now)
	if !ok {
		// A usage-limit error says the account is at its limit; the
		// windows last reported stay as they were.
		if !bytes.Contains(frame, []byte("usage_limit_reached")) {
			return
		}
		e := translate.ClassifyFrame(frame)
		if e == nil || !e.UsageLimit {
			return
		}
		rl = translate.RateLimits{LimitReached: true}
		if s.served != nil && accountID != "" {
			resets := e.ResetsAt
			if resets.IsZero() && e.ResetsIn > 0 {
				resets = now.Add(e.ResetsIn)
			}
			if resets.IsZero() {
				resets = now.Add(unknownResetWait)
			}
			s.served.Limited(accountID, resets)
		}
	} else if s.served != nil && accountID != "" {
		s.served.ObserveRateLimits(accountID, rl)
	}
	if s.seen != nil {
		s.seen(accountKey, rl)
	}
	s.mu.Lock()
	if s.last == nil {
		s.last = map[string]sentLimits{}
	}
	prev, had := s.last[accountKey]
	if had && now.Sub(prev.at) < time.Second && sameLimits(prev.rl, rl) {
		s.mu.Unlock()
		return
	}
	s.last[accountKey] = sentLimits{at: now, rl: rl}
	s.mu.Unlock()
	msg := &controlplanev1.RateLimits{Account: accountKey, PlanType: rl.PlanType, LimitReached: rl.LimitReached, AtUnixMs: now.UnixMilli()}
	for _, w := range rl.Windows {
		qw := &controlplanev1.QuotaWindow{Name: w.Name, UsedPercent: w.UsedPercent, WindowMinutes: int32(w.Window / time.Minute)}
		if !w.ResetsAt.IsZero() {
			qw.ResetsAtUnixMs = w.ResetsAt.UnixMilli()
		}
		msg.Windows = append(msg.Windows, qw)
	}
	s.report(msg)
}

// unknownResetWait is how long an account at its usage limit takes no new
// conversations when the backend did not say when the limit resets.
const unknownResetWait = 5 * time.Minute

// sameLimits reports whether two reports say the same thing (a reset
// computed from reset_after_seconds may move by a second).
func sameLimits(a, b translate.RateLimits) bool {
	if a.PlanType != b.PlanType || a.LimitReached != b.LimitReached || len(a.Windows) != len(b.Windows) {
		return false
	}
	for i := range a.Windows {
		x, y := a.Windows[i], b.Windows[i]
		d := x.ResetsAt.Sub(y.ResetsAt)
		if x.Name != y.Name || x.UsedPercent != y.UsedPercent || x.Window != y.Window || d < -time.Second || d > time.Second {
			return false
		}
	}
	return true
}
