package node

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
)

// reporting403 wraps the pool's dialer so that every upgrade the backend
// refuses with 403 is reported to the control plane through the agent
// (adaptive pacing lowers the account's rate on them).
func reporting403(d pool.Dialer, report func(accountKey string)) pool.Dialer {
	return pool.DialerFunc(func(ctx context.Context, p pool.Partition) (pool.Conn, error) {
		c, err := d.Dial(ctx, p)
		if err != nil {
			var ue *upstream.UpgradeError
			if errors.As(err, &ue) && ue.Status == http.StatusForbidden && p.Account != "" {
				report(account.Key(p.Account))
			}
			return nil, err // never a typed nil inside the interface
		}
		return c, nil
	})
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
