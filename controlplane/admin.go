package controlplane

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// PolicyReader reads accounts and their policies (GetAccount,
// ListAccounts, and the pushes and checks that need an account's
// policy). Account returns store.ErrNotFound for an unknown key.
type PolicyReader interface {
	Account(ctx context.Context, key string, now time.Time) (store.Account, error)
	Accounts(ctx context.Context, now time.Time) ([]store.Account, error)
	// Defaults is the policy of an account without a stored one.
	Defaults() pacing.Policy
}

// PolicyWriter changes an account's policy (SetRate, SetBudget,
// SetAdaptive); a change the store cannot record now is
// store.ErrUnavailable.
type PolicyWriter interface {
	UpdatePolicy(ctx context.Context, key string, now time.Time, update func(pacing.Policy) (pacing.Policy, error)) (store.Account, error)
	// SetAdaptive turns adaptive mode on or off (persisted with the policy).
	SetAdaptive(ctx context.Context, key string, enabled bool, now time.Time) (store.Account, error)
}

type adminService struct {
	controlplanev1.UnimplementedAdminServiceServer
	s *Server
}

func validKey(key string) error {
	if err := store.ValidateKey(key); err != nil {
		return &invalidError{msg: "key: " + err.Error()}
	}
	return nil
}

func (a *adminService) SetRate(ctx context.Context, req *controlplanev1.SetRateRequest) (*controlplanev1.SetRateResponse, error) {
	s := a.s
	if err := validKey(req.GetKey()); err != nil {
		return nil, s.toStatus(ctx, "SetRate", err)
	}
	rate := int(req.GetRatePerMinute())
	if err := pacing.ValidateRate(rate); err != nil {
		return nil, s.toStatus(ctx, "SetRate", err)
	}
	if req.Burst != nil {
		if err := pacing.ValidateBurst(int(req.GetBurst())); err != nil {
			return nil, s.toStatus(ctx, "SetRate", err)
		}
	}
	acct, err := s.opts.Policies.UpdatePolicy(ctx, req.GetKey(), s.now(), func(p pacing.Policy) (pacing.Policy, error) {
		p.RatePerMinute = rate
		if req.Burst != nil {
			p.Burst = int(req.GetBurst())
		}
		return p, nil
	})
	if err != nil {
		return nil, s.toStatus(ctx, "SetRate", err)
	}
	s.log.InfoContext(ctx, "rate set", "account", acct.Key, "rate_per_minute", acct.Policy.RatePerMinute,
		"burst", acct.Policy.Burst, "policy_version", acct.PolicyVersion)
	s.notePolicy(ctx, acct)
	s.agents.push(acct.Key)
	return &controlplanev1.SetRateResponse{Account: toProto(acct)}, nil
}

func (a *adminService) SetBudget(ctx context.Context, req *controlplanev1.SetBudgetRequest) (*controlplanev1.SetBudgetResponse, error) {
	s := a.s
	if err := validKey(req.GetKey()); err != nil {
		return nil, s.toStatus(ctx, "SetBudget", err)
	}
	if req.IdleTimeoutMs == nil && req.TotalTimeoutMs == nil && req.MaxRetries == nil {
		return nil, s.toStatus(ctx, "SetBudget", invalidf("set at least one of idle_timeout_ms, total_timeout_ms, max_retries"))
	}
	acct, err := s.opts.Policies.UpdatePolicy(ctx, req.GetKey(), s.now(), func(p pacing.Policy) (pacing.Policy, error) {
		b, err := mergeBudget(p.Budget, req)
		if err != nil {
			return p, err
		}
		p.Budget = b
		return p, nil
	})
	if err != nil {
		return nil, s.toStatus(ctx, "SetBudget", err)
	}
	b := acct.Policy.Budget
	s.log.InfoContext(ctx, "budget set", "account", acct.Key, "idle_timeout_ms", b.IdleTimeout.Milliseconds(),
		"total_timeout_ms", b.TotalTimeout.Milliseconds(), "max_retries", b.MaxRetries,
		"wait_bound_ms", b.WaitBound.Milliseconds(), "policy_version", acct.PolicyVersion)
	s.notePolicy(ctx, acct)
	s.agents.push(acct.Key)
	return &controlplanev1.SetBudgetResponse{Account: toProto(acct)}, nil
}

// mergeBudget applies the request's set fields to cur. Explicit values are
// validated without clamping. When the request leaves max_retries unset
// and the current retries no longer fit the idle timeout, they are lowered
// by the budget rule to the largest r whose backoff ladder is shorter than
// it; an explicit max_retries that does not fit is rejected, naming the
// largest that does. A total timeout below the idle timeout is rejected.
// The wait bound is derived by pacing.ResolveBudget.
func mergeBudget(cur pacing.Budget, req *controlplanev1.SetBudgetRequest) (pacing.Budget, error) {
	want := pacing.Budget{IdleTimeout: cur.IdleTimeout, TotalTimeout: cur.TotalTimeout, MaxRetries: cur.MaxRetries}
	// Milliseconds beyond what a time.Duration holds (about 292 years).
	const maxMs = math.MaxInt64 / int64(time.Millisecond)
	if req.IdleTimeoutMs != nil {
		ms := req.GetIdleTimeoutMs()
		if ms > maxMs || ms < -maxMs {
			return cur, &pacing.RangeError{Field: "idle_timeout_ms", Value: fmt.Sprint(ms), Allowed: "10000..3600000"}
		}
		want.IdleTimeout = time.Duration(ms) * time.Millisecond
	}
	if req.TotalTimeoutMs != nil {
		ms := req.GetTotalTimeoutMs()
		if ms > maxMs || ms < -maxMs {
			return cur, &pacing.RangeError{Field: "total_timeout_ms", Value: fmt.Sprint(ms), Allowed: fmt.Sprintf("10000..%d", maxMs)}
		}
		want.TotalTimeout = time.Duration(ms) * time.Millisecond
	}
	if req.MaxRetries != nil {
		want.MaxRetries = int(req.GetMaxRetries())
	}
	if err := want.Validate(); err != nil {
		return cur, err
	}
	if want.TotalTimeout >= want.IdleTimeout {
		if fit := fittingRetries(want.IdleTimeout); want.MaxRetries > fit {
			if req.MaxRetries != nil {
				return cur, invalidf("max_retries %d does not fit the %dms idle timeout: its backoff ladder takes %dms; the largest that fits is %d",
					want.MaxRetries, want.IdleTimeout.Milliseconds(), pacing.Ladder(want.MaxRetries).Milliseconds(), fit)
			}
			want.MaxRetries = fit
		}
	}
	idle, total, retries := want.IdleTimeout, want.TotalTimeout, want.MaxRetries
	got, notices := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: &idle, TotalTimeout: &total, MaxRetries: &retries})
	if got.IdleTimeout != idle || got.TotalTimeout != total || got.MaxRetries != retries {
		msgs := make([]string, 0, len(notices))
		for _, n := range notices {
			msgs = append(msgs, n.Message)
		}
		return cur, invalidf("budget idle_timeout_ms=%d total_timeout_ms=%d max_retries=%d is inconsistent and is not clamped: %s",
			idle.Milliseconds(), total.Milliseconds(), retries, strings.Join(msgs, "; "))
	}
	return got, nil
}

// fittingRetries is the largest retry count (up to pacing.MaxMaxRetries)
// whose backoff ladder is strictly shorter than idle.
func fittingRetries(idle time.Duration) int {
	r := pacing.MaxMaxRetries
	for r > 0 && pacing.Ladder(r) >= idle {
		r--
	}
	return r
}

func (a *adminService) GetAccount(ctx context.Context, req *controlplanev1.GetAccountRequest) (*controlplanev1.GetAccountResponse, error) {
	s := a.s
	if err := validKey(req.GetKey()); err != nil {
		return nil, s.toStatus(ctx, "GetAccount", err)
	}
	acct, err := s.opts.Policies.Account(ctx, req.GetKey(), s.now())
	if err != nil {
		return nil, s.toStatus(ctx, "GetAccount", err)
	}
	return &controlplanev1.GetAccountResponse{Account: s.withCounts(toProto(acct)), Store: infoProto(s.opts.Policies.Info())}, nil
}

// Page sizes of ListAccounts and ListAgents: a page of accounts with
// 128-byte keys is about 250 KB at most, and an agent lists up to 1000
// accounts (about 24 KB), so either answer stays under a client's 4 MB
// default receive limit.
const (
	DefaultAccountsPage = 500
	MaxAccountsPage     = 1000
	DefaultAgentsPage   = 20
	MaxAgentsPage       = 100
	// Sign-ins are small (ListLogins); a scoped agent credential names up
	// to 1000 accounts, as an agent does (ListAgentCredentials).
	DefaultLoginsPage     = 500
	MaxLoginsPage         = 1000
	DefaultAgentCredsPage = 20
	MaxAgentCredsPage     = 100
)

// maxPageToken bounds a page token: the key or name of the last item of
// the previous page.
const maxPageToken = 256

// pageOf sorts items by keyOf and returns the page a request asked for
// (page_size and page_token, as ListAccounts takes them) and the next page
// token.
func pageOf[T any](items []T, keyOf func(T) string, pageSizeReq int32, token string, def, limit int) ([]T, string, error) {
	size, err := pageSize(pageSizeReq, def, limit)
	if err != nil {
		return nil, "", err
	}
	if len(token) > maxPageToken {
		return nil, "", invalidf("page_token is not one this server returned; want empty or a previous answer's next_page_token")
	}
	slices.SortFunc(items, func(a, b T) int { return strings.Compare(keyOf(a), keyOf(b)) })
	pg, next := page(items, keyOf, token, size)
	return pg, next, nil
}

// listRequest is a paged list request (ListLogins, ListAgentCredentials,
// ListMembers).
type listRequest interface {
	GetPageSize() int32
	GetPageToken() string
}

// listPage answers a paged list RPC op from a store's records: list reads
// them (its failure goes through fail), toProto converts each, and the
// page the request asked for comes back with the next page token.
func listPage[S, P any](ctx context.Context, s *Server, op string, req listRequest, def, limit int,
	list func(context.Context) ([]S, error), fail func(context.Context, string, error) error,
	toProto func(S) P, keyOf func(P) string) ([]P, string, error) {
	items, err := list(ctx)
	if err != nil {
		return nil, "", fail(ctx, op, err)
	}
	out := make([]P, len(items))
	for i, it := range items {
		out[i] = toProto(it)
	}
	pg, next, err := pageOf(out, keyOf, req.GetPageSize(), req.GetPageToken(), def, limit)
	if err != nil {
		return nil, "", s.toStatus(ctx, op, err)
	}
	return pg, next, nil
}

// pageSize resolves a request's page size: 0 is def, 1..limit as given.
func pageSize(n int32, def, limit int) (int, error) {
	switch {
	case n == 0:
		return def, nil
	case n < 0 || int(n) > limit:
		return 0, invalidf("page_size %d is out of range; allowed 1..%d, or 0 for %d", n, limit, def)
	}
	return int(n), nil
}

// page returns the items of sorted (by key) after the page token, at most
// size of them, and the next page token (the last key returned; empty on
// the last page). The token is the last key of the previous page, so a
// page stays correct when items come and go between calls.
func page[T any](sorted []T, keyOf func(T) string, token string, size int) ([]T, string) {
	i := 0
	if token != "" {
		i, _ = slices.BinarySearchFunc(sorted, token, func(t T, k string) int { return strings.Compare(keyOf(t), k) })
		if i < len(sorted) && keyOf(sorted[i]) == token {
			i++
		}
	}
	rest := sorted[i:]
	if len(rest) <= size {
		return rest, ""
	}
	return rest[:size], keyOf(rest[size-1])
}

func (a *adminService) ListAccounts(ctx context.Context, req *controlplanev1.ListAccountsRequest) (*controlplanev1.ListAccountsResponse, error) {
	s := a.s
	size, err := pageSize(req.GetPageSize(), DefaultAccountsPage, MaxAccountsPage)
	if err != nil {
		return nil, s.toStatus(ctx, "ListAccounts", err)
	}
	if tok := req.GetPageToken(); tok != "" && store.ValidateKey(tok) != nil {
		return nil, s.toStatus(ctx, "ListAccounts", invalidf("page_token is not one this server returned; want empty or a previous answer's next_page_token"))
	}
	accts, err := s.opts.Policies.Accounts(ctx, s.now())
	if err != nil {
		return nil, s.toStatus(ctx, "ListAccounts", err)
	}
	pg, next := page(accts, func(a store.Account) string { return a.Key }, req.GetPageToken(), size)
	out := make([]*controlplanev1.Account, 0, len(pg))
	for _, a := range pg {
		out = append(out, s.withCounts(toProto(a)))
	}
	return &controlplanev1.ListAccountsResponse{Accounts: out, Store: infoProto(s.opts.Policies.Info()), NextPageToken: next}, nil
}

func infoProto(i store.Info) *controlplanev1.StoreInfo {
	return &controlplanev1.StoreInfo{
		Kind:           i.Kind,
		Address:        i.Address,
		Replica:        i.Replica,
		Replicas:       int32(i.Replicas),
		Degraded:       i.Degraded,
		Epoch:          i.Epoch,
		LostUnixMs:     unixMs(i.LostAt),
		Loss:           i.Loss,
		RestoredUnixMs: unixMs(i.RestoredAt),
		Restored:       i.Restored,
		Healing:        i.Healing,
		Warnings:       i.Warnings,
	}
}

// withCounts adds this replica's counters for the account to p.
func (s *Server) withCounts(p *controlplanev1.Account) *controlplanev1.Account {
	p.CountersSinceUnixMs = s.metrics.accounts.since.UnixMilli()
	c := s.metrics.accounts.lookup(p.GetKey())
	if c == nil {
		return p
	}
	p.Counted = true
	p.Admits = c.decisions[pacing.KindAdmit].Load()
	p.Waits = c.decisions[pacing.KindWait].Load()
	p.Refusals = c.decisions[pacing.KindRefuse].Load()
	p.ForbiddenUpgrades = c.upstream403.Load()
	return p
}

func toProto(a store.Account) *controlplanev1.Account {
	p := a.Policy
	return &controlplanev1.Account{
		Key:            a.Key,
		RatePerMinute:  int32(p.RatePerMinute),
		Burst:          int32(p.Burst),
		Tokens:         a.Tokens,
		WaitBoundMs:    p.Budget.WaitBound.Milliseconds(),
		IdleTimeoutMs:  p.Budget.IdleTimeout.Milliseconds(),
		TotalTimeoutMs: p.Budget.TotalTimeout.Milliseconds(),
		MaxRetries:     int32(p.Budget.MaxRetries),
		PolicyVersion:  a.PolicyVersion,
		CanRefuse:      p.CanRefuse(),
		Enabled:        p.Enabled(),
		Custom:         a.Custom,

		EffectiveRatePerMinute: int32(a.EffectiveRate),
		Adaptive:               a.Adaptive,
		PausedUntilUnixMs:      unixMs(a.PausedUntil),
		Unreadable:             a.Unreadable,
	}
}

func (a *adminService) ListAgents(ctx context.Context, req *controlplanev1.ListAgentsRequest) (*controlplanev1.ListAgentsResponse, error) {
	s := a.s
	size, err := pageSize(req.GetPageSize(), DefaultAgentsPage, MaxAgentsPage)
	if err != nil {
		return nil, s.toStatus(ctx, "ListAgents", err)
	}
	if len(req.GetPageToken()) > maxAgentIDLen {
		return nil, s.toStatus(ctx, "ListAgents", invalidf("page_token is not one this server returned; want empty or a previous answer's next_page_token"))
	}
	pg, next := page(s.agents.fleet(ctx), (*controlplanev1.Agent).GetId, req.GetPageToken(), size)
	return &controlplanev1.ListAgentsResponse{Agents: pg, NextPageToken: next}, nil
}

func (a *adminService) SetAdaptive(ctx context.Context, req *controlplanev1.SetAdaptiveRequest) (*controlplanev1.SetAdaptiveResponse, error) {
	s := a.s
	if err := validKey(req.GetKey()); err != nil {
		return nil, s.toStatus(ctx, "SetAdaptive", err)
	}
	acct, err := s.opts.Policies.SetAdaptive(ctx, req.GetKey(), req.GetEnabled(), s.now())
	if err != nil {
		return nil, s.toStatus(ctx, "SetAdaptive", err)
	}
	s.log.InfoContext(ctx, "adaptive mode set", "account", acct.Key, "adaptive", acct.Adaptive,
		"rate_per_minute", acct.Policy.RatePerMinute, "policy_version", acct.PolicyVersion)
	s.agents.push(acct.Key)
	return &controlplanev1.SetAdaptiveResponse{Account: toProto(acct)}, nil
}

// notePolicy tells the operator what a new policy means when it does not
// simply pace: pacing off, or pacing that never refuses.
func (s *Server) notePolicy(ctx context.Context, acct store.Account) {
	p := acct.Policy
	switch {
	case p.RatePerMinute == 0:
		s.log.InfoContext(ctx, "pacing is off for this account (rate 0)", "account", acct.Key, "notice", pacing.KeyPacingOff)
	case !p.Enabled():
		s.log.WarnContext(ctx, p.DisabledNotice().Message, "account", acct.Key, "notice", pacing.KeyPacingDisabled)
	case !p.CanRefuse():
		s.log.InfoContext(ctx, p.NoRefuseNotice().Message, "account", acct.Key, "notice", pacing.KeyPacingNoRefuse)
	}
}

// ListQuotas returns the latest plan usage reported for each account (or
// one), from the store every replica shares.
func (a *adminService) ListQuotas(ctx context.Context, req *controlplanev1.ListQuotasRequest) (*controlplanev1.ListQuotasResponse, error) {
	s := a.s
	if k := req.GetKey(); k != "" {
		if err := validKey(k); err != nil {
			return nil, s.toStatus(ctx, "ListQuotas", err)
		}
	}
	if s.opts.Quotas == nil {
		return nil, status.Error(codes.Unimplemented, "ListQuotas: this control plane's store keeps no plan quotas")
	}
	quotas, err := s.opts.Quotas.Quotas(ctx, req.GetKey())
	if err != nil {
		return nil, s.toStatus(ctx, "ListQuotas", err)
	}
	now := s.now()
	resp := &controlplanev1.ListQuotasResponse{Quotas: make([]*controlplanev1.AccountQuota, 0, len(quotas))}
	for _, q := range quotas {
		s.quotaView.observe(q, now)
		aq := &controlplanev1.AccountQuota{Key: q.Key, PlanType: q.PlanType, LimitReached: q.LimitReached,
			ReportedUnixMs: unixMs(q.ReportedAt), AgentId: q.AgentID}
		for _, w := range q.Windows {
			qw := &controlplanev1.QuotaWindow{Name: w.Name, UsedPercent: w.UsedPercent,
				WindowMinutes: int32(w.Window / time.Minute), ResetsAtUnixMs: unixMs(w.ResetsAt)}
			if burn, ok, empties, eok := s.quotaView.forecast(q.Key, w.Name, now); ok {
				qw.BurnPercentPerMinute = &burn
				if eok {
					secs := int64(empties / time.Second)
					qw.EmptiesInSeconds = &secs
				}
			}
			aq.Windows = append(aq.Windows, qw)
		}
		resp.Quotas = append(resp.Quotas, aq)
	}
	return resp, nil
}
