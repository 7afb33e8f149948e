package broker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
)

// Defaults of Options.
const (
	// DefaultLeaseTTL bounds how long a refresh lease is held (Redis): a
	// replica that dies holding it delays the next refresh by at most this.
	DefaultLeaseTTL = 45 * time.Second
	// DefaultLeaseWait bounds the wait for a lease another holder has.
	DefaultLeaseWait = 50 * time.Second
	// DefaultTick is how often Run looks for logins due for a refresh.
	DefaultTick = time.Second
	// refreshTimeout is the token endpoint's HTTP timeout; below the
	// lease's TTL so a refresh never outlives its lease.
	refreshTimeout = 30 * time.Second
)

// LoginReader reads the stored logins.
type LoginReader interface {
	// Login returns key's login, or store.ErrNotFound.
	Login(ctx context.Context, key string) (store.Login, error)
	// Logins returns every login, ordered by key.
	Logins(ctx context.Context) ([]store.Login, error)
}

// LoginWriter writes and removes logins.
type LoginWriter interface {
	// PutLogin writes l if the stored generation is still l.Generation
	// (0: no record) and lease, when not nil, is still held; it returns
	// the record as written, its generation incremented. Otherwise
	// store.ErrConflict (someone else wrote) or store.ErrFenced (the
	// lease was lost).
	PutLogin(ctx context.Context, l store.Login, lease *store.Lease) (store.Login, error)
	// RemoveLogin deletes key's login, or returns store.ErrNotFound.
	RemoveLogin(ctx context.Context, key string) error
}

// Leaser hands out the refresh leases: one holder per account at a time
// across every process sharing the store.
type Leaser interface {
	// AcquireLease waits until it holds key's lease, for at most ttl once
	// held, or ctx ends.
	AcquireLease(ctx context.Context, key string, ttl time.Duration) (*store.Lease, error)
}

// Logins is what the broker needs of a logins store.
// *store.LoginFile (the data directory) and *redisstore.Store (Redis)
// implement it.
type Logins interface {
	LoginReader
	LoginWriter
	Leaser
}

// Options configures New. New copies it.
type Options struct {
	// Logins keeps the sealed logins. (Required)
	Logins Logins
	// Key seals the tokens. (Required)
	Key Key
	// TokenEndpoint is the OAuth token endpoint. (Optional; default
	// codexauth.DefaultTokenEndpoint)
	TokenEndpoint string
	// ClientID is sent with each refresh. (Optional; default Codex CLI's)
	ClientID string
	// HTTPClient sends refresh requests. (Optional; default a client with
	// a 30s timeout)
	HTTPClient *http.Client
	// Skew: a token is refreshed when its expiry is within Skew, or within
	// a quarter of its lifetime when that is less (codexauth.SkewFor, the
	// data plane's rule). (Optional; default 120s)
	Skew time.Duration
	// LeaseTTL bounds a held refresh lease (Redis). (Optional; default 45s)
	LeaseTTL time.Duration
	// Tick is how often Run looks for logins due. (Optional; default 1s)
	Tick time.Duration
	// Now is the clock. (Optional; default time.Now)
	Now func() time.Time
	// Logger receives refresh events, never a token. (Optional; default
	// discards)
	Logger *slog.Logger
	// Registerer receives the broker's metrics. (Optional)
	Registerer prometheus.Registerer
}

// Broker holds every account's login for the fleet and is its only
// refresher. It is safe for concurrent use.
type Broker struct {
	logins             Logins
	key                Key
	endpoint, clientID string
	client             *http.Client
	skew, leaseTTL     time.Duration
	tick               time.Duration
	now                func() time.Time
	log                *slog.Logger
	refreshes          *prometheus.CounterVec
	adopted            prometheus.Counter

	flight   singleflight.Group
	inflight inflight // the refreshes running, which Run waits for

	mu      sync.Mutex           // guards backoff
	backoff map[string]time.Time // per account: no new refresh attempt before this, after a transient failure
}

// transientBackoff is how long a transient refresh failure (the token
// endpoint unreachable, a 5xx) holds off the next attempt while the
// current token is still valid.
const transientBackoff = 5 * time.Second

// holdOff reports whether key's refresh is held off at now after a
// transient failure.
func (b *Broker) holdOff(key string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return now.Before(b.backoff[key])
}

func (b *Broker) setBackoff(key string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if until.IsZero() {
		delete(b.backoff, key)
		return
	}
	b.backoff[key] = until
}

// New checks opts and returns a Broker. Every bad option is reported.
func New(opts Options) (*Broker, error) {
	var errs []error
	if opts.Logins == nil {
		errs = append(errs, errors.New("field Logins is required"))
	}
	if opts.Key.IsZero() {
		errs = append(errs, errors.New("field Key is required"))
	}
	endpoint := opts.TokenEndpoint
	if endpoint == "" {
		endpoint = codexauth.DefaultTokenEndpoint
	}
	if err := CheckEndpoint(endpoint); err != nil {
		errs = append(errs, err)
	}
	if opts.Skew < 0 || opts.LeaseTTL < 0 || opts.Tick < 0 {
		errs = append(errs, errors.New("fields Skew, LeaseTTL and Tick must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("new credential broker: %w", err)
	}
	b := &Broker{
		logins:   opts.Logins,
		key:      opts.Key,
		endpoint: endpoint,
		clientID: opts.ClientID,
		client:   opts.HTTPClient,
		skew:     opts.Skew,
		leaseTTL: opts.LeaseTTL,
		tick:     opts.Tick,
		now:      opts.Now,
		log:      opts.Logger,
		backoff:  map[string]time.Time{},
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clodex_controlplane_broker_refreshes_total",
			Help: "Refresh-token redemptions by this replica, by result (ok, transient, login_required).",
		}, []string{"result"}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clodex_controlplane_broker_adopted_total",
			Help: "Refreshes this replica skipped because another replica had just written a fresh token.",
		}),
	}
	if b.clientID == "" {
		b.clientID = codexauth.DefaultClientID
	}
	if b.client == nil {
		b.client = &http.Client{Timeout: refreshTimeout}
	}
	if b.skew == 0 {
		b.skew = codexauth.DefaultSkew
	}
	if b.leaseTTL == 0 {
		b.leaseTTL = DefaultLeaseTTL
	}
	if b.tick == 0 {
		b.tick = DefaultTick
	}
	if b.now == nil {
		b.now = time.Now
	}
	if b.log == nil {
		b.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	b.log = b.log.With("component", "controlplane/broker")
	for _, r := range []string{"ok", "transient", "login_required"} {
		b.refreshes.WithLabelValues(r)
	}
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{b.refreshes, b.adopted} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("new credential broker: register metrics: %w", err)
			}
		}
	}
	return b, nil
}

// CheckEndpoint checks a --token-endpoint value.
func CheckEndpoint(endpoint string) error {
	if u, err := url.Parse(endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("token endpoint %q is invalid; want an http or https URL such as %s", endpoint, codexauth.DefaultTokenEndpoint)
	}
	return nil
}

// sealedTokens is the plaintext of Login.Sealed.
type sealedTokens struct {
	Access  string `json:"access_token"`
	Refresh string `json:"refresh_token"`
	ID      string `json:"id_token,omitempty"`
}

func (b *Broker) seal(key string, t sealedTokens) []byte {
	plain, _ := json.Marshal(t) //nolint:gosec // G117: this is the plaintext that is sealed at once, never stored or logged as is

	return b.key.seal(key, plain)
}

// load reads account key's sign-in and opens its sealed tokens. Errors:
// ErrUnknownAccount (wrapped), *UnavailableError (the store failed),
// *NeedsLoginError, or the unsealing's.
func (b *Broker) load(ctx context.Context, key string) (store.Login, sealedTokens, error) {
	l, err := b.logins.Login(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return store.Login{}, sealedTokens{}, fmt.Errorf("account %s: %w", key, ErrUnknownAccount)
	}
	if err != nil {
		return store.Login{}, sealedTokens{}, &UnavailableError{Key: key, Err: err}
	}
	if l.NeedsLogin != "" {
		return store.Login{}, sealedTokens{}, &NeedsLoginError{Key: key, Reason: l.NeedsLogin}
	}
	t, err := b.open(l)
	if err != nil {
		return store.Login{}, sealedTokens{}, err
	}
	return l, t, nil
}

func (b *Broker) open(l store.Login) (sealedTokens, error) {
	plain, err := b.key.open(l.Key, l.Sealed)
	if err != nil {
		return sealedTokens{}, fmt.Errorf("login %s: %w", l.Key, err)
	}
	var t sealedTokens
	if err := json.Unmarshal(plain, &t); err != nil {
		return sealedTokens{}, fmt.Errorf("login %s: the sealed tokens are not the expected JSON", l.Key)
	}
	return t, nil
}

// Status is a login as operators see it: never a token.
type Status struct {
	Key       string
	AccountID string
	// Expiry is the current access token's expiry (zero when unknown).
	Expiry time.Time
	// Refreshed is when the tokens were last written.
	Refreshed time.Time
	// Refreshes counts the refreshes since the last import or login.
	Refreshes int64
	// NeedsLogin is why the sign-in can no longer be refreshed; "" while
	// it can.
	NeedsLogin string
	// Unreadable, when set, says the stored sign-in does not decode and no
	// good copy was at hand (which record and why): an operator must
	// import or log the account in again.
	Unreadable string
}

func statusOf(l store.Login) Status {
	return Status{Key: l.Key, AccountID: l.AccountID, Expiry: l.Expiry, Refreshed: l.Refreshed,
		Refreshes: l.Refreshes, NeedsLogin: l.NeedsLogin, Unreadable: l.Unreadable}
}

// Token is an access token handed to a data plane.
type Token struct {
	Key       string
	AccountID string
	Access    codexauth.Secret
	// Expiry is the token's expiry; zero when unknown.
	Expiry time.Time
}

// NeedsLoginError reports an account whose sign-in can no longer be
// refreshed: an operator must log it in again.
type NeedsLoginError struct {
	Key    string
	Reason string // the identity provider's refusal code, never a token
}

func (e *NeedsLoginError) Error() string {
	return fmt.Sprintf("account %s needs a new login (its refresh token was refused: %s); an operator must run `clodexctl account login` (or `clodexctl account import --codex-auth FILE`)",
		e.Key, e.Reason)
}

// UnavailableError reports a token that could not be refreshed for a
// transient reason (the token endpoint unreachable, a 5xx) while the
// current one has expired or was rejected: retry later.
type UnavailableError struct {
	Key string
	Err error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("account %s: no usable access token: %v", e.Key, e.Err)
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// ErrUnknownAccount reports an account the broker holds no login for.
var ErrUnknownAccount = errors.New("no login for this account; an operator must run `clodexctl account login` or `clodexctl account import --codex-auth FILE`")

// ErrInvalidLogin reports tokens Import cannot store.
var ErrInvalidLogin = errors.New("invalid login")

// Import stores a sign-in (from a Codex auth.json or a device-code login)
// for the account its access token names, replacing the account's
// previous one, and returns the account's status. accountID is used when
// the token carries none.
func (b *Broker) Import(ctx context.Context, access, refresh, id codexauth.Secret, accountID string) (Status, error) {
	if strings.TrimSpace(access.Reveal()) == "" {
		return Status{}, fmt.Errorf("import login: %w: the access token is empty", ErrInvalidLogin)
	}
	if strings.TrimSpace(refresh.Reveal()) == "" {
		return Status{}, fmt.Errorf("import login: %w: the refresh token is empty; the control plane must be able to refresh the sign-in", ErrInvalidLogin)
	}
	c := (&codexauth.AuthFile{Tokens: &codexauth.AuthTokens{AccessToken: access, AccountID: accountID}}).Credential()
	if c.AccountID == "" {
		return Status{}, fmt.Errorf("import login: %w: the access token names no ChatGPT account and none was given", ErrInvalidLogin)
	}
	key := account.Key(c.AccountID)
	lctx, cancel := context.WithTimeout(ctx, DefaultLeaseWait)
	defer cancel()
	lease, err := b.logins.AcquireLease(lctx, key, b.leaseTTL)
	if err != nil {
		return Status{}, fmt.Errorf("import login: %w", err)
	}
	defer b.release(ctx, lease)
	var gen int64
	old, err := b.logins.Login(ctx, key)
	var bad *store.BadRecordError
	switch {
	case err == nil:
		gen = old.Generation
	case errors.As(err, &bad):
		gen = -1 // a new sign-in replaces an unreadable one
		b.log.WarnContext(ctx, "replacing an unreadable sign-in", "account", key, "record", bad.Where)
	case !errors.Is(err, store.ErrNotFound):
		return Status{}, fmt.Errorf("import login: %w", err)
	}
	now := b.now()
	l, err := b.logins.PutLogin(ctx, store.Login{
		Key:        key,
		AccountID:  c.AccountID,
		Sealed:     b.seal(key, sealedTokens{Access: access.Reveal(), Refresh: refresh.Reveal(), ID: id.Reveal()}),
		Expiry:     c.Expiry,
		LifetimeMs: codexauth.TokenLifetime(access).Milliseconds(),
		Refreshed:  now,
		Generation: gen,
	}, lease)
	if err != nil {
		return Status{}, fmt.Errorf("import login: %w", err)
	}
	b.log.InfoContext(ctx, "login stored", "account", key, "expires_at", l.Expiry, "replaced", gen != 0)
	return statusOf(l), nil
}

// List returns every login's status, ordered by key.
func (b *Broker) List(ctx context.Context) ([]Status, error) {
	ls, err := b.logins.Logins(ctx)
	if err != nil {
		return nil, fmt.Errorf("list logins: %w", err)
	}
	out := make([]Status, len(ls))
	for i, l := range ls {
		out[i] = statusOf(l)
	}
	return out, nil
}

// Get returns key's status, or an error wrapping ErrUnknownAccount.
func (b *Broker) Get(ctx context.Context, key string) (Status, error) {
	l, err := b.logins.Login(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return Status{}, fmt.Errorf("account %s: %w", key, ErrUnknownAccount)
	}
	if err != nil {
		return Status{}, err
	}
	return statusOf(l), nil
}

// Remove forgets key's login (an error wrapping ErrUnknownAccount when
// there is none). Data planes keep the access token they hold until it
// expires.
func (b *Broker) Remove(ctx context.Context, key string) error {
	err := b.logins.RemoveLogin(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("account %s: %w", key, ErrUnknownAccount)
	}
	if err != nil {
		return fmt.Errorf("remove login %s: %w", key, err)
	}
	b.log.InfoContext(ctx, "login removed", "account", key)
	return nil
}

// Token returns a usable access token for key: the stored one while it is
// fresh, else one refreshed first (under the account's lease, so that one
// replica refreshes and the others adopt its token). rejected, when not
// empty, is a token the upstream refused: a different one is returned, by
// a forced refresh if needed. Errors: *NeedsLoginError, ErrUnknownAccount,
// *UnavailableError.
func (b *Broker) Token(ctx context.Context, key string, rejected codexauth.Secret) (Token, error) {
	l, t, err := b.load(ctx, key)
	if err != nil {
		return Token{}, err
	}
	now := b.now()
	if tok, ok := b.usable(l, t, rejected, now); ok {
		return tok, nil
	}
	if rejected == "" && (l.Expiry.IsZero() || now.Before(l.Expiry)) && b.holdOff(key, now) {
		tok, _ := b.usable(l, t, "", now)
		return tok, nil // still valid; the last refresh failed moments ago
	}
	flightKey := key
	if rejected != "" {
		sum := sha256.Sum256([]byte(rejected.Reveal()))
		flightKey += ":" + hex.EncodeToString(sum[:8])
	}
	ch := b.flight.DoChan(flightKey, func() (any, error) {
		// The refresh outlives a caller that gives up (a redeemed
		// refresh token must be written back), bounded by its own
		// deadline; Run waits for it.
		b.inflight.start()
		defer b.inflight.end()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultLeaseWait+refreshTimeout)
		defer cancel()
		return b.refresh(rctx, key, rejected)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return Token{}, r.Err
		}
		return r.Val.(Token), nil
	case <-ctx.Done():
		return Token{}, ctx.Err()
	}
}

// usable returns l's token if it needs no refresh at now: fresh, or after a
// rejection, different from the rejected one and unexpired.
func (b *Broker) usable(l store.Login, t sealedTokens, rejected codexauth.Secret, now time.Time) (Token, bool) {
	tok := Token{Key: l.Key, AccountID: l.AccountID, Access: codexauth.Secret(t.Access), Expiry: l.Expiry}
	if rejected != "" {
		return tok, tok.Access != rejected && (l.Expiry.IsZero() || now.Before(l.Expiry))
	}
	return tok, codexauth.Fresh(l.Expiry, time.Duration(l.LifetimeMs)*time.Millisecond, b.skew, now)
}

func (b *Broker) release(ctx context.Context, lease *store.Lease) {
	if err := lease.Release(); err != nil {
		b.log.WarnContext(ctx, "release refresh lease", "account", lease.Key, "err", err)
	}
}

// refresh renews key's token under its lease: re-read the login and adopt
// a token another replica wrote meanwhile; else redeem the refresh token
// once and write the rotated tokens back (fenced by the lease). A refusal
// for good marks the login needs-login and is never retried.
func (b *Broker) refresh(ctx context.Context, key string, rejected codexauth.Secret) (Token, error) {
	lctx, cancel := context.WithTimeout(ctx, DefaultLeaseWait)
	lease, err := b.logins.AcquireLease(lctx, key, b.leaseTTL)
	cancel()
	if err != nil {
		return Token{}, &UnavailableError{Key: key, Err: err}
	}
	defer b.release(ctx, lease)
	l, t, err := b.load(ctx, key)
	if err != nil {
		return Token{}, err
	}
	now := b.now()
	if tok, ok := b.usable(l, t, rejected, now); ok {
		// Another replica (or an import) wrote it while we waited.
		b.adopted.Inc()
		b.log.DebugContext(ctx, "adopted the access token another writer stored", "account", key, "expires_at", l.Expiry)
		return tok, nil
	}
	tr, err := codexauth.Redeem(ctx, b.client, b.endpoint, b.clientID, codexauth.Secret(t.Refresh))
	if reason, dead := codexauth.LoginRequired(err); dead {
		b.refreshes.WithLabelValues("login_required").Inc()
		l.NeedsLogin = reason
		if _, perr := b.logins.PutLogin(ctx, l, lease); perr != nil {
			b.log.ErrorContext(ctx, "record needs-login", "account", key, "err", perr)
		}
		b.log.WarnContext(ctx, "the sign-in can no longer be refreshed; an operator must run `clodexctl account login`",
			"account", key, "reason", reason)
		return Token{}, &NeedsLoginError{Key: key, Reason: reason}
	}
	if err != nil {
		b.refreshes.WithLabelValues("transient").Inc()
		b.setBackoff(key, now.Add(transientBackoff))
		if rejected == "" && (l.Expiry.IsZero() || now.Before(l.Expiry)) {
			tok, _ := b.usable(l, t, "", now)
			b.log.WarnContext(ctx, "token refresh failed; serving the current access token until it expires",
				"account", key, "expires_at", l.Expiry, "err", err)
			return tok, nil
		}
		return Token{}, &UnavailableError{Key: key, Err: err}
	}
	next := sealedTokens{Access: tr.AccessToken.Reveal(), Refresh: tr.RefreshToken.Reveal(), ID: tr.IDToken.Reveal()}
	if next.Refresh == "" {
		next.Refresh = t.Refresh // not rotated
	}
	if next.ID == "" {
		next.ID = t.ID
	}
	old := l.Expiry
	l.Sealed = b.seal(key, next)
	l.Expiry = tr.ExpiresAt(now)
	l.LifetimeMs = codexauth.TokenLifetime(tr.AccessToken).Milliseconds()
	if l.LifetimeMs == 0 && tr.ExpiresIn != nil {
		l.LifetimeMs = *tr.ExpiresIn * 1000
	}
	l.Refreshed = now
	l.Refreshes++
	written, err := b.logins.PutLogin(ctx, l, lease)
	if err != nil {
		// The rotated refresh token could not be stored: the sign-in is
		// lost unless the write is retried, which only a new login fixes.
		b.refreshes.WithLabelValues("transient").Inc()
		b.log.ErrorContext(ctx, "rotated tokens not stored; the account may need a new login", "account", key, "err", err)
		return Token{}, &UnavailableError{Key: key, Err: fmt.Errorf("store rotated tokens: %w", err)}
	}
	b.setBackoff(key, time.Time{})
	b.refreshes.WithLabelValues("ok").Inc()
	b.log.InfoContext(ctx, "access token refreshed", "account", key, "expires_at", written.Expiry,
		"replaced_expires_in", old.Sub(now).Round(time.Millisecond).String(), "forced", rejected != "")
	return Token{Key: key, AccountID: l.AccountID, Access: tr.AccessToken, Expiry: written.Expiry}, nil
}

// Run refreshes every login ahead of its expiry, every Options.Tick, until
// ctx ends. Every replica runs it; the lease makes one of them redeem each
// refresh token and the others adopt the result. When ctx ends it waits
// for the refreshes still running (those Token started too), each bounded
// by its own deadline, so nothing writes the logins after it returns.
func (b *Broker) Run(ctx context.Context) error {
	t := time.NewTicker(b.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			b.inflight.wait()
			return nil
		case <-t.C:
			b.refreshDue(ctx)
		}
	}
}

// refreshDue refreshes the logins due at now.
func (b *Broker) refreshDue(ctx context.Context) {
	ls, err := b.logins.Logins(ctx)
	if err != nil {
		b.log.DebugContext(ctx, "list logins", "err", err)
		return
	}
	now := b.now()
	for _, l := range ls {
		if l.NeedsLogin != "" || l.Unreadable != "" || codexauth.Fresh(l.Expiry, time.Duration(l.LifetimeMs)*time.Millisecond, b.skew, now) {
			continue
		}
		if _, err := b.Token(ctx, l.Key, ""); err != nil && ctx.Err() == nil {
			var nl *NeedsLoginError
			if !errors.As(err, &nl) { // logged once by refresh
				b.log.WarnContext(ctx, "refresh ahead of expiry", "account", l.Key, "err", err)
			}
		}
	}
}
