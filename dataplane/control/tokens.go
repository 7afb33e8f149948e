package control

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const (
	// tokenRetryAfter is the retry hint of a turn while no token can be had.
	tokenRetryAfter = 5 * time.Second
	// tokenTimeout bounds one CredentialService RPC.
	tokenTimeout = 10 * time.Second
	// accountsPoll is how often the token loop reads the accounts again
	// and asks again for an account marked unusable.
	accountsPoll = 30 * time.Second
	// tokenTick is how often the token loop looks for tokens due.
	tokenTick = time.Second
)

// entry is one account's last answer from the broker.
type entry struct {
	cred     codexauth.Credential
	lifetime time.Duration
	dead     error     // a *accounts.LoginRequiredError; the account is skipped
	deadAt   time.Time // when dead was recorded; the token loop asks again after accountsPoll
}

// Accounts returns the account keys this data plane serves, sorted:
// Config.Accounts or, with Config.Broker and no Config.Accounts, the
// broker's answer to ServedAccounts (asked once, then kept fresh by Run).
// With the broker it returns a *accounts.UnavailableError while the
// broker cannot be reached yet, and a *accounts.LoginRequiredError when
// it holds no sign-in this data plane may use.
func (c *Client) Accounts(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	keys := c.served()
	if !c.broker || c.fixed != nil {
		return slices.Clone(keys), nil
	}
	if keys == nil {
		var err error
		if keys, err = c.learn(ctx); err != nil {
			return nil, c.unavailable(err)
		}
	}
	if len(keys) == 0 {
		return nil, &accounts.LoginRequiredError{Message: fmt.Sprintf(
			"The control plane at %s holds no ChatGPT sign-in this data plane may use; an operator must log an account in with `clodexctl account login` (or `clodexctl account import --codex-auth FILE`)", c.target)}
	}
	return keys, nil
}

// Credential returns a usable credential of the account with key
// accountKey from the broker, fetching a fresh token first when the
// current one is due (codexauth.Fresh with the default skew). A sign-in an
// operator must renew is a *accounts.LoginRequiredError; a broker that
// cannot supply one now, a *accounts.UnavailableError (the turn is
// answered 503 with retry-after). It needs Config.Broker.
func (c *Client) Credential(ctx context.Context, accountKey string) (codexauth.Credential, error) {
	if err := c.tokenCall(ctx, accountKey); err != nil {
		return codexauth.Credential{}, fmt.Errorf("credential: %w", err)
	}
	cred, err := c.credentialOf(ctx, accountKey)
	if err != nil && !errors.Is(err, accounts.ErrLoginRequired) {
		return codexauth.Credential{}, c.unavailable(err)
	}
	return cred, err
}

// Rejected reports a token of the account the upstream answered 401: the
// broker replaces it (one forced refresh at most, for the whole fleet) and
// the new credential is returned; a token already replaced returns the
// current one. Errors are Credential's, and accounts.ErrTokenUnchanged
// when the broker answers with the rejected token.
func (c *Client) Rejected(ctx context.Context, accountKey string, token codexauth.Secret) (codexauth.Credential, error) {
	if err := c.tokenCall(ctx, accountKey); err != nil {
		return codexauth.Credential{}, fmt.Errorf("report rejected token: %w", err)
	}
	if token == "" {
		return codexauth.Credential{}, errors.New("report rejected token: the token is empty")
	}
	c.tokensMu.Lock()
	e, ok := c.tokens[accountKey]
	c.tokensMu.Unlock()
	if !ok || e.dead != nil || e.cred.AccessToken != token {
		return c.Credential(ctx, accountKey) // already replaced
	}
	sum := sha256.Sum256([]byte(token.Reveal()))
	e, err := c.fetch(ctx, accountKey, sum[:])
	if err != nil {
		if errors.Is(err, accounts.ErrLoginRequired) {
			return codexauth.Credential{}, err
		}
		return codexauth.Credential{}, c.unavailable(err)
	}
	if e.cred.AccessToken == token {
		return codexauth.Credential{}, fmt.Errorf("account %s: the broker answered with the rejected token: %w", accountKey, accounts.ErrTokenUnchanged)
	}
	return e.cred, nil
}

// tokenCall checks a Credential or Rejected call.
func (c *Client) tokenCall(ctx context.Context, key string) error {
	switch {
	case !c.broker:
		return errNoBroker
	case !account.IsKey(key):
		return ErrInvalidKey
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return c.Refused() // no token, not even a cached one, while refused
}

// unavailable is the error of a turn while no token can be had; while
// the control plane refuses this data plane's agent credential, the
// refusal.
func (c *Client) unavailable(err error) error {
	var refused *AgentRefusedError
	if errors.As(err, &refused) {
		return refused
	}
	return &accounts.UnavailableError{
		Message: fmt.Sprintf("No ChatGPT access token yet: this data plane gets its tokens from the control plane's credential broker at %s, which cannot supply one now (%s)",
			c.target, reason(err)),
		RetryAfter: tokenRetryAfter,
	}
}

// reason describes an RPC failure in a few words, never a token.
func reason(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	return err.Error()
}

// learn asks the broker for the accounts it serves this data plane (once
// for all concurrent callers). Keys that are not account keys are dropped
// with a warning.
func (c *Client) learn(ctx context.Context) ([]string, error) {
	v, err, _ := c.flight.Do("accounts", func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tokenTimeout)
		defer cancel()
		resp, err := c.api().credential.ServedAccounts(cctx, &controlplanev1.ServedAccountsRequest{})
		c.observed(ctx, err)
		if e, ok := c.refuse(ctx, err); ok {
			return nil, e
		}
		if err != nil {
			return nil, err
		}
		var keys []string // nil when none: asked again at the next call
		for _, k := range resp.GetAccounts() {
			if !account.IsKey(k) {
				c.log.WarnContext(ctx, "not serving an invalid account key from the broker; want acct_ followed by 16 lowercase hex digits")
				continue
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		c.tokensMu.Lock()
		changed := c.learned == nil || !slices.Equal(keys, c.learned)
		c.learned = keys
		c.tokensMu.Unlock()
		if changed {
			c.log.InfoContext(ctx, "accounts from the control plane's credential broker", "accounts", keys)
		}
		return keys, nil
	})
	if err != nil {
		return nil, err
	}
	return slices.Clone(v.([]string)), nil
}

// credentialOf returns key's usable credential, fetching a fresh token
// when the current one is due; a dead sign-in is its
// *accounts.LoginRequiredError, an unreachable broker the RPC error.
func (c *Client) credentialOf(ctx context.Context, k string) (codexauth.Credential, error) {
	now := c.now()
	c.tokensMu.Lock()
	e, ok := c.tokens[k]
	c.tokensMu.Unlock()
	if ok && e.dead != nil {
		return codexauth.Credential{}, e.dead
	}
	if ok && codexauth.Fresh(e.cred.Expiry, e.lifetime, codexauth.DefaultSkew, now) {
		return e.cred, nil
	}
	ne, err := c.fetch(ctx, k, nil)
	if err == nil {
		return ne.cred, nil
	}
	var refused *AgentRefusedError
	if errors.Is(err, accounts.ErrLoginRequired) || errors.As(err, &refused) {
		return codexauth.Credential{}, err
	}
	if ok && now.Before(e.cred.Expiry) { // still valid: serve it while the broker is away
		c.log.WarnContext(ctx, "fetch a fresh access token; using the current one until it expires", "account", k, "err", reason(err))
		return e.cred, nil
	}
	return codexauth.Credential{}, err
}

// fetch asks the broker for key's token (rejected: the SHA-256 of a token
// the upstream refused), once for all concurrent callers. Refusals that
// need an operator are recorded and returned as
// *accounts.LoginRequiredError.
func (c *Client) fetch(ctx context.Context, key string, rejected []byte) (entry, error) {
	v, err, _ := c.flight.Do("token:"+key+":"+hex.EncodeToString(rejected), func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tokenTimeout)
		defer cancel()
		resp, err := c.api().credential.GetToken(cctx, &controlplanev1.GetTokenRequest{Account: key, RejectedSha256: rejected})
		c.observed(ctx, err)
		if e, ok := c.refuse(ctx, err); ok {
			return entry{}, e
		}
		if err != nil {
			switch status.Code(err) {
			case codes.FailedPrecondition, codes.NotFound, codes.PermissionDenied:
				lr := &accounts.LoginRequiredError{Message: fmt.Sprintf(
					"The control plane at %s cannot supply a ChatGPT credential for account %s: %s", c.target, key, status.Convert(err).Message())}
				c.tokensMu.Lock()
				c.tokens[key] = entry{dead: lr, deadAt: c.now()}
				c.tokensMu.Unlock()
				c.log.WarnContext(ctx, "account unusable until an operator logs it in", "account", key, "err", reason(err))
				return entry{}, lr
			}
			return entry{}, err
		}
		tok := codexauth.Secret(resp.GetAccessToken())
		cred := codexauth.Credential{AccessToken: tok, AccountID: resp.GetAccountId()}
		if ms := resp.GetExpiresAtUnixMs(); ms != 0 {
			cred.Expiry = time.UnixMilli(ms)
		}
		e := entry{cred: cred, lifetime: codexauth.TokenLifetime(tok)}
		c.tokensMu.Lock()
		c.tokens[key] = e
		wasWaiting := c.waiting
		c.waiting = false
		c.tokensMu.Unlock()
		if wasWaiting {
			c.log.InfoContext(ctx, "the control plane's credential broker answers again", "target", c.target)
		}
		c.log.DebugContext(ctx, "access token from the broker", "account", key, "expires_at", cred.Expiry)
		return e, nil
	})
	if err != nil {
		return entry{}, err
	}
	return v.(entry), nil
}

// tokenLoop learns the accounts and keeps their tokens fresh until ctx
// ends: every second it fetches the tokens that are due (and asks again
// for accounts marked unusable every 30 s, in case an operator logged
// them in), and it reads the accounts again every 30 s. While the broker
// cannot supply a token it says once that it waits, and again when it
// answers. It is owned by Run.
func (c *Client) tokenLoop(ctx context.Context) {
	t := time.NewTicker(tokenTick)
	defer t.Stop()
	var lastLearn time.Time
	for {
		now := c.now()
		// While the control plane refuses this data plane there is
		// nothing to fetch; the agent stream asks until it accepts it.
		if c.Refused() == nil {
			if c.served() == nil || (c.fixed == nil && now.Sub(lastLearn) >= accountsPoll) {
				if keys, err := c.learn(ctx); err != nil {
					c.noteWaiting(ctx, err)
				} else {
					lastLearn = now
					if len(keys) == 0 {
						c.log.WarnContext(ctx, "the control plane's credential broker holds no sign-in this data plane may use; an operator must run `clodexctl account login`")
					}
				}
			}
			if keys := c.served(); keys != nil {
				c.refreshDue(ctx, keys, now)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refreshDue fetches the tokens of keys due at now.
func (c *Client) refreshDue(ctx context.Context, keys []string, now time.Time) {
	for _, k := range keys {
		c.tokensMu.Lock()
		e, ok := c.tokens[k]
		c.tokensMu.Unlock()
		if ok && e.dead != nil && now.Sub(e.deadAt) < accountsPoll {
			continue
		}
		if ok && e.dead == nil && codexauth.Fresh(e.cred.Expiry, e.lifetime, codexauth.DefaultSkew, now) {
			continue
		}
		if _, err := c.fetch(ctx, k, nil); err != nil && !errors.Is(err, accounts.ErrLoginRequired) && ctx.Err() == nil {
			c.noteWaiting(ctx, err)
		}
	}
}

// noteWaiting logs once that the broker cannot supply a token, saying
// what turns get meanwhile: the tokens this data plane holds serve them
// until they expire; only without one is a turn answered 503.
func (c *Client) noteWaiting(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	now := c.now()
	c.tokensMu.Lock()
	first := !c.waiting
	c.waiting = true
	held, until := 0, time.Time{}
	for _, e := range c.tokens {
		if e.dead == nil && now.Before(e.cred.Expiry) {
			held++
			if until.IsZero() || e.cred.Expiry.Before(until) {
				until = e.cred.Expiry
			}
		}
	}
	c.tokensMu.Unlock()
	if !first {
		return
	}
	if held == 0 {
		c.log.WarnContext(ctx, "waiting for the control plane's credential broker; turns are answered 503 with retry-after until it supplies a token",
			"target", c.target, "err", reason(err))
		return
	}
	c.log.WarnContext(ctx, "the control plane's credential broker does not answer; turns go on with the access tokens this data plane holds until they expire (a turn on an account whose token expired is answered 503 with retry-after)",
		"target", c.target, "err", reason(err), "tokens_held", held, "first_expiry", until.UTC().Format(time.RFC3339))
}
