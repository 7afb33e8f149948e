// Package brokered is the credential source of a data plane in a fleet
// without an auth.json: the control plane's credential broker holds each
// account's sign-in and hands this data plane short-lived access tokens
// over CredentialService, never a refresh token.
//
//	src, err := brokered.New(brokered.Config{Conn: conn, Target: addr})
//	go src.Run(ctx)                     // learn the accounts, fetch ahead of expiry
//	cred, err := src.Credential(ctx)    // per turn
//	cred, err = src.Rejected(ctx, tok)  // after an upstream 401: one forced refresh, by the broker
//
// The accounts served are the agent token's scope, or every account the
// broker holds (ServedAccounts), unless Config.Accounts names them.
// Credential returns the first account whose sign-in is usable;
// CredentialFor a named one (the data plane spreads new conversations
// over every account it has a token of, Config.OnAccountID). A token is fetched
// again when its expiry is within the data plane's skew rule
// (codexauth.SkewFor), the moment the broker refreshes it, so the
// broker's lease makes one refresh per expiry for the whole fleet.
//
// Errors are the credentials package's: *credentials.UnavailableError
// while the broker cannot be reached or has no usable token yet (the turn
// is answered 503 with retry-after; Run keeps trying and logs that it
// waits), *credentials.LoginRequiredError when an operator must log an
// account in (clodexctl account login). Tokens never reach logs or
// errors.
package brokered

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Defaults of Config.
const (
	DefaultRetryAfter   = 5 * time.Second
	DefaultTimeout      = 10 * time.Second
	DefaultAccountsPoll = 30 * time.Second
	tick                = time.Second
)

// Config configures New. New copies it.
type Config struct {
	// Conn reaches the control plane. (Required)
	Conn grpc.ClientConnInterface
	// Target names the control plane in messages. (Optional)
	Target string
	// Accounts are the account keys to serve. (Optional; default the
	// broker's answer to ServedAccounts)
	Accounts []string
	// Skew is the data plane's refresh skew (codexauth.SkewFor).
	// (Optional; default codexauth.DefaultSkew)
	Skew time.Duration
	// RetryAfter is the retry hint while no token can be had. (Optional;
	// default 5s)
	RetryAfter time.Duration
	// Timeout bounds one RPC. (Optional; default 10s)
	Timeout time.Duration
	// Clock is the time source. (Optional; default time.Now)
	Clock func() time.Time
	// Logger receives events, never a token. (Optional; default discards)
	Logger *slog.Logger
	// OnAccounts is called with the served accounts whenever they are
	// learned or change, synchronously. (Optional)
	OnAccounts func(keys []string)
	// OnAccountID is called with an account's ChatGPT account id the
	// first time a token of it is fetched, synchronously: the data plane
	// spreads new conversations over these accounts. (Optional)
	OnAccountID func(accountID string)
}

// entry is one account's last answer.
type entry struct {
	cred     codexauth.Credential
	lifetime time.Duration
	dead     error     // a *credentials.LoginRequiredError; the account is skipped
	deadAt   time.Time // when dead was recorded; Run asks again after DefaultAccountsPoll
}

// Source is a credential source backed by the control plane's broker. It
// is safe for concurrent use.
type Source struct {
	cfg    Config
	client controlplanev1.CredentialServiceClient
	log    *slog.Logger
	fixed  bool // Config.Accounts given

	flight singleflight.Group

	mu       sync.Mutex // guards the following fields
	accounts []string   // nil until learned
	tokens   map[string]entry
	waiting  bool // the broker is unreachable and "waiting" was logged
}

// New checks cfg and returns a Source; it makes no call.
func New(cfg Config) (*Source, error) {
	if cfg.Conn == nil {
		return nil, errors.New("brokered: field Conn is required")
	}
	if cfg.Skew <= 0 {
		cfg.Skew = codexauth.DefaultSkew
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Target == "" {
		cfg.Target = "the control plane"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s := &Source{
		cfg:    cfg,
		client: controlplanev1.NewCredentialServiceClient(cfg.Conn),
		log:    log.With("component", "dataplane/brokered"),
		tokens: map[string]entry{},
	}
	if len(cfg.Accounts) > 0 {
		s.fixed = true
		s.accounts = slices.Clone(cfg.Accounts)
		slices.Sort(s.accounts)
	}
	return s, nil
}

// Accounts returns the accounts served, nil until they are known.
func (s *Source) Accounts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.accounts)
}

// unavailable is the error of a turn while no token can be had.
func (s *Source) unavailable(err error) error {
	return &credentials.UnavailableError{
		Message: fmt.Sprintf("No ChatGPT access token yet: this data plane gets its tokens from the control plane's credential broker at %s, which cannot supply one now (%s)",
			s.cfg.Target, reason(err)),
		RetryAfter: s.cfg.RetryAfter,
	}
}

// reason describes an RPC failure in a few words, never a token.
func reason(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	return err.Error()
}

// learn fetches the served accounts unless they are fixed.
func (s *Source) learn(ctx context.Context) ([]string, error) {
	if s.fixed {
		return s.Accounts(), nil
	}
	v, err, _ := s.flight.Do("accounts", func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
		defer cancel()
		resp, err := s.client.ServedAccounts(cctx, &controlplanev1.ServedAccountsRequest{})
		if err != nil {
			return nil, err
		}
		keys := slices.Clone(resp.GetAccounts())
		slices.Sort(keys)
		s.mu.Lock()
		changed := !slices.Equal(keys, s.accounts) || s.accounts == nil
		s.accounts = keys
		s.mu.Unlock()
		if changed {
			s.log.InfoContext(ctx, "accounts from the control plane's credential broker", "accounts", keys)
			if s.cfg.OnAccounts != nil {
				s.cfg.OnAccounts(keys)
			}
		}
		return keys, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]string), nil
}

// Credential returns a usable credential for the first account whose
// sign-in is usable, fetching a fresh token first when the current one
// is due.
func (s *Source) Credential(ctx context.Context) (codexauth.Credential, error) {
	if err := ctx.Err(); err != nil {
		return codexauth.Credential{}, err
	}
	keys := s.Accounts()
	if keys == nil {
		var err error
		if keys, err = s.learn(ctx); err != nil {
			return codexauth.Credential{}, s.unavailable(err)
		}
	}
	if len(keys) == 0 {
		return codexauth.Credential{}, &credentials.LoginRequiredError{Message: fmt.Sprintf(
			"The control plane at %s holds no ChatGPT sign-in this data plane may use; an operator must log an account in with `clodexctl account login` (or `clodexctl account import --codex-auth FILE`)", s.cfg.Target)}
	}
	var dead, lastErr error
	for _, k := range keys {
		cred, err := s.credentialOf(ctx, k)
		if err == nil {
			return cred, nil
		}
		if errors.Is(err, credentials.ErrLoginRequired) {
			dead = err
			continue
		}
		lastErr = err
	}
	if lastErr != nil {
		return codexauth.Credential{}, s.unavailable(lastErr)
	}
	return codexauth.Credential{}, dead
}

// credentialOf returns key's usable credential, fetching a fresh token
// when the current one is due; a dead sign-in is its
// *credentials.LoginRequiredError, an unreachable broker the RPC error.
func (s *Source) credentialOf(ctx context.Context, k string) (codexauth.Credential, error) {
	now := s.cfg.Clock()
	s.mu.Lock()
	e, ok := s.tokens[k]
	s.mu.Unlock()
	if ok && e.dead != nil {
		return codexauth.Credential{}, e.dead
	}
	if ok && codexauth.Fresh(e.cred.Expiry, e.lifetime, s.cfg.Skew, now) {
		return e.cred, nil
	}
	ne, err := s.fetch(ctx, k, nil)
	if err == nil {
		return ne.cred, nil
	}
	if errors.Is(err, credentials.ErrLoginRequired) {
		return codexauth.Credential{}, err
	}
	if ok && now.Before(e.cred.Expiry) { // still valid: serve it while the broker is away
		s.log.WarnContext(ctx, "fetch a fresh access token; using the current one until it expires", "account", k, "err", reason(err))
		return e.cred, nil
	}
	return codexauth.Credential{}, err
}

// CredentialFor returns the credential of the account whose ChatGPT
// account id is accountID (the pool's Partition.Account): the
// gateway.AccountCredentials of a data plane serving several accounts.
func (s *Source) CredentialFor(ctx context.Context, accountID string) (codexauth.Credential, error) {
	if err := ctx.Err(); err != nil {
		return codexauth.Credential{}, err
	}
	cred, err := s.credentialOf(ctx, account.Key(accountID))
	if err != nil && !errors.Is(err, credentials.ErrLoginRequired) {
		return codexauth.Credential{}, s.unavailable(err)
	}
	return cred, err
}

// RejectedFor is Rejected for a token of accountID.
func (s *Source) RejectedFor(ctx context.Context, _ string, token codexauth.Secret) (codexauth.Credential, error) {
	return s.Rejected(ctx, token)
}

// Rejected reports a token the upstream answered 401: the broker replaces
// it (one forced refresh at most, for the whole fleet) and the new
// credential is returned.
func (s *Source) Rejected(ctx context.Context, token codexauth.Secret) (codexauth.Credential, error) {
	if token == "" {
		return codexauth.Credential{}, errors.New("report rejected token: the token is empty")
	}
	s.mu.Lock()
	key := ""
	for k, e := range s.tokens {
		if e.cred.AccessToken == token {
			key = k
		}
	}
	s.mu.Unlock()
	if key == "" {
		return s.Credential(ctx) // already replaced
	}
	sum := sha256.Sum256([]byte(token.Reveal()))
	e, err := s.fetch(ctx, key, sum[:])
	if err != nil {
		if errors.Is(err, credentials.ErrLoginRequired) {
			return codexauth.Credential{}, err
		}
		return codexauth.Credential{}, s.unavailable(err)
	}
	if e.cred.AccessToken == token {
		return codexauth.Credential{}, fmt.Errorf("account %s: the broker answered with the rejected token: %w", key, credentials.ErrTokenUnchanged)
	}
	return e.cred, nil
}

// fetch asks the broker for key's token (rejected: the SHA-256 of a token
// the upstream refused), once for all concurrent callers. Refusals that
// need an operator are recorded and returned as
// *credentials.LoginRequiredError.
func (s *Source) fetch(ctx context.Context, key string, rejected []byte) (entry, error) {
	v, err, _ := s.flight.Do("token:"+key+":"+hex.EncodeToString(rejected), func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
		defer cancel()
		resp, err := s.client.GetToken(cctx, &controlplanev1.GetTokenRequest{Account: key, RejectedSha256: rejected})
		if err != nil {
			switch status.Code(err) {
			case codes.FailedPrecondition, codes.NotFound, codes.PermissionDenied:
				lr := &credentials.LoginRequiredError{Message: fmt.Sprintf(
					"The control plane at %s cannot supply a ChatGPT credential for account %s: %s", s.cfg.Target, key, status.Convert(err).Message())}
				s.mu.Lock()
				s.tokens[key] = entry{dead: lr, deadAt: s.cfg.Clock()}
				s.mu.Unlock()
				s.log.WarnContext(ctx, "account unusable until an operator logs it in", "account", key, "err", reason(err))
				return entry{}, lr
			}
			return entry{}, err
		}
		tok := codexauth.Secret(resp.GetAccessToken())
		c := codexauth.Credential{AccessToken: tok, AccountID: resp.GetAccountId()}
		if ms := resp.GetExpiresAtUnixMs(); ms != 0 {
			c.Expiry = time.UnixMilli(ms)
		}
		e := entry{cred: c, lifetime: codexauth.TokenLifetime(tok)}
		s.mu.Lock()
		_, known := s.tokens[key]
		known = known && s.tokens[key].dead == nil
		s.tokens[key] = e
		wasWaiting := s.waiting
		s.waiting = false
		s.mu.Unlock()
		if wasWaiting {
			s.log.InfoContext(ctx, "the control plane's credential broker answers again", "target", s.cfg.Target)
		}
		if !known && c.AccountID != "" && s.cfg.OnAccountID != nil {
			s.cfg.OnAccountID(c.AccountID)
		}
		s.log.DebugContext(ctx, "access token from the broker", "account", key, "expires_at", c.Expiry)
		return e, nil
	})
	if err != nil {
		return entry{}, err
	}
	return v.(entry), nil
}

// Run learns the accounts and keeps their tokens fresh until ctx ends:
// every second it fetches the tokens that are due (and retries accounts
// marked unusable every 30 s, in case an operator logged them in), and it
// re-reads the accounts every 30 s. While the broker cannot be reached it
// says once that it waits, and again when it answers.
func (s *Source) Run(ctx context.Context) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	var lastLearn time.Time
	for {
		now := s.cfg.Clock()
		if s.Accounts() == nil || (!s.fixed && now.Sub(lastLearn) >= DefaultAccountsPoll) {
			if _, err := s.learn(ctx); err != nil {
				s.noteWaiting(ctx, err)
			} else {
				lastLearn = now
				if len(s.Accounts()) == 0 {
					s.log.WarnContext(ctx, "the control plane's credential broker holds no sign-in this data plane may use; an operator must run `clodexctl account login`")
				}
			}
		}
		if s.Accounts() != nil {
			s.refreshDue(ctx, now)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// refreshDue fetches the tokens due at now.
func (s *Source) refreshDue(ctx context.Context, now time.Time) {
	for _, k := range s.Accounts() {
		s.mu.Lock()
		e, ok := s.tokens[k]
		s.mu.Unlock()
		if ok && e.dead != nil && now.Sub(e.deadAt) < DefaultAccountsPoll {
			continue
		}
		if ok && e.dead == nil && codexauth.Fresh(e.cred.Expiry, e.lifetime, s.cfg.Skew, now) {
			continue
		}
		if _, err := s.fetch(ctx, k, nil); err != nil && !errors.Is(err, credentials.ErrLoginRequired) && ctx.Err() == nil {
			s.noteWaiting(ctx, err)
		}
	}
}

// noteWaiting logs once that the broker cannot be reached.
func (s *Source) noteWaiting(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	first := !s.waiting
	s.waiting = true
	s.mu.Unlock()
	if first {
		s.log.WarnContext(ctx, "waiting for the control plane's credential broker; turns are answered 503 with retry-after until it supplies a token",
			"target", s.cfg.Target, "err", reason(err))
	}
}
