package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
)

// multiAccount returns the account credentials and set when the turn is
// to choose among several accounts, else nil.
func (s *Server) multiAccount() (AccountCredentials, *accounts.Set) {
	ac, ok := s.cfg.Credentials.(AccountCredentials)
	if !ok || s.cfg.Accounts == nil || s.cfg.Accounts.Len() < 2 {
		return nil, nil
	}
	return ac, s.cfg.Accounts
}

// credential returns the turn's credential. With several accounts, a
// conversation whose idle head lives on an account keeps that account
// unless it is at its usage limit; a new conversation, or one whose
// account is limited, gets the account Accounts.Pick chooses. A move
// drops the head on the old account (the turn resends the whole
// conversation), counts in clodex_dataplane_account_moves_total and is
// logged once. t.items must be set.
func (t *turnRun) credential(ctx context.Context) (codexauth.Credential, error) {
	s := t.s
	ac, set := s.multiAccount()
	if ac == nil {
		return s.cfg.Credentials.Credential(ctx)
	}
	part := pool.Partition{Model: t.turn.Model, Effort: t.turn.Effort, PromptCacheKey: t.turn.PromptCacheKey}
	holder, held := s.pool.Holder(part, t.items, set.Accounts())
	var until time.Time
	if held {
		var limited bool
		if until, limited = set.LimitedUntil(holder); !limited {
			return ac.CredentialFor(ctx, holder)
		}
	}
	var id string
	var cred codexauth.Credential
	found := false
	for range set.Len() + 1 { // the last Pick finds every account down
		var err error
		id, err = set.Pick()
		if errors.Is(err, accounts.ErrAllDown) {
			return s.cfg.Credentials.Credential(ctx) // says why the sign-in is unusable
		}
		if err != nil {
			return codexauth.Credential{}, fmt.Errorf("choose an upstream account: %w", err)
		}
		cred, err = ac.CredentialFor(ctx, id)
		if err == nil {
			found = true
			break
		}
		if !errors.Is(err, credentials.ErrLoginRequired) {
			return codexauth.Credential{}, err
		}
		// A sign-in that needs an operator: try the next account.
		set.Down(id, downWait)
		s.cfg.Logger.Warn("account skipped for new conversations: its sign-in needs a login", "account", account.Key(id), "for", downWait)
	}
	if !found {
		return s.cfg.Credentials.Credential(ctx)
	}
	if held {
		old := part
		old.Account = holder
		s.pool.Forget(old, t.items)
		s.metrics.moves.Inc()
		s.cfg.Logger.Info("conversation moves to another account: its account is at its usage limit; the whole conversation is resent",
			"from", account.Key(holder), "to", account.Key(id), "limited_until", until.UTC().Format(time.RFC3339), "items", len(t.items))
	}
	return cred, nil
}

// downWait is how long an account whose sign-in needs a login takes no new
// conversation before it is tried again.
const downWait = time.Minute

// rejected asks for one refresh of the turn's rejected token, on the
// turn's account when the source serves several.
func (t *turnRun) rejected(ctx context.Context, token codexauth.Secret) (codexauth.Credential, error) {
	if ac, _ := t.s.multiAccount(); ac != nil && t.part.Account != "" {
		return ac.RejectedFor(ctx, t.part.Account, token)
	}
	return t.s.cfg.Credentials.Rejected(ctx, token)
}

// allLimited is the client's answer when every account is at its usage
// limit: 429 naming the account whose reset comes first, retry-after that
// reset.
func allLimited(e *accounts.AllLimitedError) *translate.UpstreamError {
	in := max(e.ResetsIn, time.Second)
	return &translate.UpstreamError{
		Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: translate.CodeUsageLimitReached,
		Message: fmt.Sprintf("Every ChatGPT account this data plane serves is at its usage limit; the first to reset is %s, at %s (in %s)",
			account.Key(e.Account), e.ResetsAt.UTC().Format(time.RFC3339), translate.FormatWait(in)),
		UsageLimit: true, ResetsIn: in, ResetsAt: e.ResetsAt,
	}
}
