package credentials

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/clodex/clodex/internal/atomicfile"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/filelock"
)

// RefreshMode says whether a [RefreshingFile] refreshes the access token
// itself.
type RefreshMode int

const (
	// RefreshAuto refreshes ahead of expiry and after a 401, under the
	// auth.json lock. The default for a standalone data plane.
	RefreshAuto RefreshMode = iota
	// RefreshNever never calls the token endpoint: the file is re-read
	// instead, and the user is told once that another host or the operator
	// must refresh it. The default for a data plane in a fleet, where copies
	// of one account's auth.json on several hosts would otherwise trip
	// refresh-token reuse detection.
	RefreshNever
)

// String returns the mode's flag value, "auto" or "never".
func (m RefreshMode) String() string {
	switch m {
	case RefreshAuto:
		return "auto"
	case RefreshNever:
		return "never"
	}
	return fmt.Sprintf("RefreshMode(%d)", int(m))
}

// ParseRefreshMode parses a --refresh flag value: "auto" or "never".
func ParseRefreshMode(s string) (RefreshMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto":
		return RefreshAuto, nil
	case "never":
		return RefreshNever, nil
	}
	return 0, fmt.Errorf("refresh mode %q is invalid; choices are auto, never", s)
}

// Defaults of [FileConfig].
const (
	// DefaultLockWait bounds the wait for the auth.json lock.
	DefaultLockWait = 30 * time.Second
	// DefaultRefreshTimeout is the HTTP client timeout of a refresh request.
	DefaultRefreshTimeout = 30 * time.Second
)

// minRereadInterval throttles RefreshNever re-reads of the file while the
// token is close to expiry.
const minRereadInterval = time.Second

var (
	// ErrLoginRequired reports a refresh token the identity provider refused
	// for good (refresh_token_reused, refresh_token_expired,
	// refresh_token_invalidated, or any 401): it is never presented again
	// and the user has to sign in again.
	ErrLoginRequired = errors.New("the ChatGPT sign-in can no longer be refreshed; run `codex login` to sign in again")
	// ErrRefreshDisabled reports that a new token is needed but the source
	// is in RefreshNever mode and the file holds none.
	ErrRefreshDisabled = errors.New("token refresh is disabled (--refresh=never)")
	// ErrTokenUnchanged reports that a token rejected upstream could not be
	// replaced by a different one.
	ErrTokenUnchanged = errors.New("the rejected access token is still the current one")
)

// FileConfig configures [NewFileSource]. NewFileSource copies it; the
// caller's value is never modified.
type FileConfig struct {
	// Path is the Codex auth.json. (Required)
	Path string
	// TokenEndpoint is the OAuth token endpoint. (Optional) Default
	// DefaultTokenEndpoint; must be an http or https URL.
	TokenEndpoint string
	// ClientID is sent with each refresh. (Optional) Default
	// DefaultClientID.
	ClientID string
	// Mode is RefreshAuto (default) or RefreshNever.
	Mode RefreshMode
	// Skew: a token is refreshed when its expiry is within Skew. (Optional)
	// Default 120s. For tokens that live less than 4*Skew (test servers
	// with short TTLs) a quarter of the token's lifetime is used instead,
	// so a 20s token is refreshed 5s before it expires, not on every call.
	Skew time.Duration
	// LockWait bounds the wait for "<Path>.lock". (Optional) Default 30s.
	LockWait time.Duration
	// HTTPClient sends refresh requests. (Optional) Default a client with a
	// 30s timeout.
	HTTPClient *http.Client
	// Clock returns the current time. (Optional) Default time.Now.
	Clock func() time.Time
	// Logger receives refresh events, never a token. (Optional) Default:
	// discard.
	Logger *slog.Logger
	// Notify receives one-time notices meant for the user ("run codex
	// login", "refresh is disabled in a fleet"). It is called synchronously
	// and must not call back into the source. (Optional) The notices are
	// logged at Warn level either way.
	Notify func(msg string)
}

// RefreshingFile is a [Source] backed by a Codex auth.json that it keeps
// fresh (docs/credentials.md §4 to §7). It is safe for concurrent use.
//
// Refreshes are single-flight within the process. Across processes (Codex
// CLI, another data plane) they are serialised by an exclusive lock on
// "<path>.lock": under the lock the file is re-read, a newer token found
// there is adopted instead of refreshing, and otherwise the refresh token
// from the file is redeemed and the rotated tokens are written back
// atomically (mode 0600), keeping every other member of the file.
type RefreshingFile struct {
	path, lockPath     string
	endpoint, clientID string
	mode               RefreshMode
	skew, lockWait     time.Duration
	client             *http.Client
	clock              func() time.Time
	logger             *slog.Logger
	notify             func(string)

	flight singleflight.Group
	work   sync.Mutex // serialises renew (and so the lock file) within the process

	mu       sync.Mutex // guards the following fields
	cur      codexauth.Credential
	lifetime time.Duration    // of cur.AccessToken (exp - iat); 0 when unknown
	refresh  codexauth.Secret // the newest refresh token known
	// fileAccess and fileRefresh are the tokens the file held when this
	// source last read or wrote it; a difference means someone else wrote it.
	fileAccess, fileRefresh codexauth.Secret
	rejected                codexauth.Secret // an access token upstream rejected; never handed out again
	dead                    codexauth.Secret // a refresh token refused for good; never presented again
	deadErr                 error            // the ErrLoginRequired error for dead
	lastRead                time.Time
	noticed                 map[string]bool // notices given since the token last changed
}

var _ Source = (*RefreshingFile)(nil)

// NewFileSource checks cfg, then loads and checks the auth.json. Every bad
// config value is reported at once; file errors name the file.
func NewFileSource(cfg FileConfig) (*RefreshingFile, error) {
	var errs []error
	if strings.TrimSpace(cfg.Path) == "" {
		errs = append(errs, errors.New("field Path is empty; want the Codex auth.json (default ~/.codex/auth.json)"))
	}
	endpoint := cfg.TokenEndpoint
	if endpoint == "" {
		endpoint = codexauth.DefaultTokenEndpoint
	}
	if u, err := url.Parse(endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("field TokenEndpoint %q is invalid; want an http or https URL such as %s", endpoint, codexauth.DefaultTokenEndpoint))
	}
	if cfg.Mode != RefreshAuto && cfg.Mode != RefreshNever {
		errs = append(errs, fmt.Errorf("field Mode %v is invalid; choices are auto, never", cfg.Mode))
	}
	if cfg.Skew < 0 {
		errs = append(errs, fmt.Errorf("field Skew %v is invalid; want 0 (default %v) or more", cfg.Skew, codexauth.DefaultSkew))
	}
	if cfg.LockWait < 0 {
		errs = append(errs, fmt.Errorf("field LockWait %v is invalid; want 0 (default %v) or more", cfg.LockWait, DefaultLockWait))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("codex credentials config: %w", err)
	}
	s := &RefreshingFile{
		path:     cfg.Path,
		lockPath: cfg.Path + ".lock",
		endpoint: endpoint,
		clientID: orDefault(cfg.ClientID, codexauth.DefaultClientID),
		mode:     cfg.Mode,
		skew:     cfg.Skew,
		lockWait: cfg.LockWait,
		client:   cfg.HTTPClient,
		clock:    cfg.Clock,
		logger:   cfg.Logger,
		notify:   cfg.Notify,
	}
	if s.skew == 0 {
		s.skew = codexauth.DefaultSkew
	}
	if s.lockWait == 0 {
		s.lockWait = DefaultLockWait
	}
	if s.client == nil {
		s.client = &http.Client{Timeout: DefaultRefreshTimeout}
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.logger = s.logger.With("component", "dataplane/credentials", "path", s.path)
	_, f, err := s.readFile()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.takeFileLocked(f)
	s.setCurLocked(f.Credential(), codexauth.TokenLifetime(f.Tokens.AccessToken))
	s.mu.Unlock()
	return s, nil
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// Path returns the auth.json the source reads and writes.
func (s *RefreshingFile) Path() string { return s.path }

// Credential implements [Source]. It returns the current credential,
// refreshing it first when it expires within the skew (RefreshAuto) or
// re-reading the file (RefreshNever). Concurrent callers share one refresh.
//
// If a refresh fails for a transient reason (network, 5xx) while the current
// token has not expired, the current token is returned and the failure
// logged. A refresh token refused for good yields an error wrapping
// [ErrLoginRequired], and a one-time notice; the refresh is never retried
// with that token. The shared refresh is detached from ctx so that one
// caller giving up does not fail the others; it is bounded by the lock wait
// and the HTTP timeout.
func (s *RefreshingFile) Credential(ctx context.Context) (codexauth.Credential, error) {
	if err := ctx.Err(); err != nil {
		return codexauth.Credential{}, err
	}
	s.mu.Lock()
	c, ok := s.usableLocked(s.clock())
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	return s.shared(ctx, "credential", "")
}

// Rejected is called after the upstream answered 401 to a request that used
// token. It forces at most one refresh (RefreshAuto) or a re-read of the file
// (RefreshNever) and returns a credential with a different access token. If
// the current token already differs from token (another caller refreshed),
// that one is returned at once. Otherwise it fails with an error wrapping
// [ErrLoginRequired], [ErrTokenUnchanged] (with [ErrRefreshDisabled] in
// RefreshNever mode), or the refresh failure. The caller retries its
// request at most once with the result.
func (s *RefreshingFile) Rejected(ctx context.Context, token codexauth.Secret) (codexauth.Credential, error) {
	if err := ctx.Err(); err != nil {
		return codexauth.Credential{}, err
	}
	if token == "" {
		return codexauth.Credential{}, errors.New("report rejected token: the token is empty")
	}
	sum := sha256.Sum256([]byte(token.Reveal()))
	return s.shared(ctx, "rejected:"+hex.EncodeToString(sum[:8]), token)
}

// shared runs renew once for all concurrent callers with the same key.
func (s *RefreshingFile) shared(ctx context.Context, key string, rejected codexauth.Secret) (codexauth.Credential, error) {
	ch := s.flight.DoChan(key, func() (any, error) {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.lockWait+2*DefaultRefreshTimeout)
		defer cancel()
		return s.renew(wctx, rejected)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return codexauth.Credential{}, r.Err
		}
		return r.Val.(codexauth.Credential), nil
	case <-ctx.Done():
		return codexauth.Credential{}, ctx.Err()
	}
}

// fresh reports whether c can be used without refreshing at now.
func (s *RefreshingFile) fresh(c codexauth.Credential, lifetime time.Duration, now time.Time) bool {
	return codexauth.Fresh(c.Expiry, lifetime, s.skew, now)
}

// unexpired reports whether c has not expired at now.
func unexpired(c codexauth.Credential, now time.Time) bool {
	return c.Expiry.IsZero() || now.Before(c.Expiry)
}

// usableLocked returns the current credential if it needs no refresh.
func (s *RefreshingFile) usableLocked(now time.Time) (codexauth.Credential, bool) {
	c := s.cur
	if c.AccessToken == s.rejected || !s.fresh(c, s.lifetime, now) {
		return c, false
	}
	return c, true
}

// setCurLocked makes c the current credential.
func (s *RefreshingFile) setCurLocked(c codexauth.Credential, lifetime time.Duration) {
	if c.AccessToken != s.cur.AccessToken {
		clear(s.noticed)
	}
	s.cur, s.lifetime = c, lifetime
}

// fileChangedLocked reports whether f differs from what this source last
// read or wrote.
func (s *RefreshingFile) fileChangedLocked(f *codexauth.AuthFile) bool {
	return f.Tokens.AccessToken != s.fileAccess || f.Tokens.RefreshToken != s.fileRefresh
}

// takeFileLocked records f as the file's content; its refresh token becomes
// the newest known.
func (s *RefreshingFile) takeFileLocked(f *codexauth.AuthFile) {
	s.fileAccess, s.fileRefresh = f.Tokens.AccessToken, f.Tokens.RefreshToken
	s.refresh = f.Tokens.RefreshToken
}

// readFile reads and parses the auth.json.
func (s *RefreshingFile) readFile() ([]byte, *codexauth.AuthFile, error) {
	data, err := os.ReadFile(s.path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("codex auth file %s does not exist; sign in with `codex login` or pass --codex-auth", s.path)
		}
		return nil, nil, fmt.Errorf("read codex auth file: %w", err)
	}
	f, err := codexauth.ParseAuthFile(s.path, data)
	if err != nil {
		return nil, nil, err
	}
	return data, f, nil
}

// renew does the work of Credential (rejected empty) and Rejected.
func (s *RefreshingFile) renew(ctx context.Context, rejected codexauth.Secret) (codexauth.Credential, error) {
	s.work.Lock()
	defer s.work.Unlock()
	now := s.clock()
	s.mu.Lock()
	if rejected != "" {
		if s.cur.AccessToken != rejected && s.cur.AccessToken != s.rejected {
			c := s.cur // already replaced by an earlier refresh
			s.mu.Unlock()
			return c, nil
		}
		// The current token is the one rejected now or earlier: replace it.
		s.rejected = s.cur.AccessToken
		rejected = s.rejected
	} else if c, ok := s.usableLocked(now); ok {
		s.mu.Unlock()
		return c, nil
	}
	s.mu.Unlock()
	if s.mode == RefreshNever {
		return s.reread(ctx, rejected)
	}
	return s.refreshShared(ctx, rejected)
}

// adoptableLocked reports whether fc, found in the file, can replace the current
// token: not the rejected one, and fresh (or, after a 401, unexpired).
func (s *RefreshingFile) adoptableLocked(fc codexauth.Credential, lifetime time.Duration, now time.Time, forced bool) bool {
	if fc.AccessToken == s.rejected || fc.AccessToken == s.cur.AccessToken {
		return false
	}
	if forced {
		return unexpired(fc, now)
	}
	return s.fresh(fc, lifetime, now)
}

// refreshShared renews the token in RefreshAuto mode. In order: take the
// auth.json lock; re-read the file and adopt a newer token another program
// wrote there; otherwise redeem the refresh token; write the rotated tokens
// back; release the lock.
func (s *RefreshingFile) refreshShared(ctx context.Context, rejected codexauth.Secret) (codexauth.Credential, error) {
	forced := rejected != ""
	if s.deadAndUnchanged() {
		return s.afterDead(rejected)
	}

	lock, err := s.lockFile(ctx)
	if err != nil {
		return s.fallback(ctx, rejected, err)
	}
	defer lock.Close()

	data, f, err := s.readFile()
	if err != nil {
		return s.fallback(ctx, rejected, err)
	}
	if fc, ok := s.adoptFromFile(f, s.clock(), forced); ok {
		s.logger.InfoContext(ctx, "adopted the access token another process wrote", "expires_at", fc.Expiry, "forced", forced)
		return fc, nil
	}

	s.mu.Lock()
	rt := s.refresh
	isDead := rt != "" && rt == s.dead
	s.mu.Unlock()
	if rt == "" {
		return s.loginRequired(ctx, rejected, "", "the file has no tokens.refresh_token")
	}
	if isDead {
		return s.afterDead(rejected)
	}
	tr, err := s.postRefresh(ctx, rt)
	if err != nil {
		return s.refreshFailed(ctx, rejected, rt, err)
	}

	cred := s.takeRefreshed(ctx, data, rt, tr, forced)
	if forced && cred.AccessToken == rejected {
		return codexauth.Credential{}, fmt.Errorf("codex auth file %s: the token endpoint answered with the same access token: %w", s.path, ErrTokenUnchanged)
	}
	return cred, nil
}

// deadAndUnchanged reports whether the refresh token is one refused for
// good and the file holds no new sign-in. A dead token stays dead: the file
// is checked without taking the lock, and the token is never presented
// again.
func (s *RefreshingFile) deadAndUnchanged() bool {
	s.mu.Lock()
	dead := s.dead != "" && s.refresh == s.dead
	s.mu.Unlock()
	if !dead {
		return false
	}
	_, f, err := s.readFile()
	if err != nil {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.fileChangedLocked(f)
}

// lockFile takes the auth.json lock, waiting at most the lock wait.
func (s *RefreshingFile) lockFile(ctx context.Context) (*filelock.Lock, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.lockWait,
		fmt.Errorf("another process has held it for more than %v", s.lockWait))
	defer cancel()
	l, err := filelock.Acquire(ctx, s.lockPath)
	if errors.Is(err, errors.ErrUnsupported) {
		err = fmt.Errorf("%w; use refresh mode never", err)
	}
	if err != nil {
		return nil, fmt.Errorf("refresh codex auth file %s: %w", s.path, err)
	}
	return l, nil
}

// adoptFromFile takes f, just read from the file, as the file's content if
// someone else (Codex CLI, another data plane, a new sign-in) wrote it
// since this source last read or wrote it: its refresh token becomes the
// newest known, ours probably having been used. Its access token becomes
// the current one, and is returned, if it is adoptable.
func (s *RefreshingFile) adoptFromFile(f *codexauth.AuthFile, now time.Time, forced bool) (codexauth.Credential, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.fileChangedLocked(f) {
		return codexauth.Credential{}, false
	}
	s.takeFileLocked(f)
	fc, lt := f.Credential(), codexauth.TokenLifetime(f.Tokens.AccessToken)
	if !s.adoptableLocked(fc, lt, now, forced) {
		return codexauth.Credential{}, false
	}
	s.setCurLocked(fc, lt)
	return fc, true
}

// refreshFailed answers a failed redemption of rt: a refresh token refused
// for good needs a new sign-in (loginRequired); any other failure is
// transient (fallback).
func (s *RefreshingFile) refreshFailed(ctx context.Context, rejected, rt codexauth.Secret, err error) (codexauth.Credential, error) {
	if reason, ok := codexauth.LoginRequired(err); ok {
		return s.loginRequired(ctx, rejected, rt, reason)
	}
	return s.fallback(ctx, rejected, fmt.Errorf("codex auth file %s: %w", s.path, err))
}

// takeRefreshed makes the tokens of tr, redeemed with rt, the current ones
// and writes them back into the file, whose content was data. A failed
// write is logged and otherwise ignored: the rotated refresh token then
// lives only in memory.
func (s *RefreshingFile) takeRefreshed(ctx context.Context, data []byte, rt codexauth.Secret, tr codexauth.TokenResponse, forced bool) codexauth.Credential {
	now := s.clock()
	newRT := tr.RefreshToken
	if newRT == "" {
		newRT = rt // the identity provider did not rotate it
	}
	s.mu.Lock()
	old := s.cur
	s.mu.Unlock()
	cred := codexauth.Credential{AccessToken: tr.AccessToken, AccountID: old.AccountID, Expiry: tr.ExpiresAt(now)}
	if c, err := codexauth.ParseClaims(tr.AccessToken); err == nil && c.AccountID != "" {
		cred.AccountID = c.AccountID
	}
	lt := codexauth.TokenLifetime(tr.AccessToken)
	if lt == 0 && tr.ExpiresIn != nil {
		lt = time.Duration(*tr.ExpiresIn) * time.Second
	}

	out, werr := updateAuthJSON(data, rotatedTokens{access: tr.AccessToken, refresh: newRT, id: tr.IDToken}, now)
	if werr == nil {
		werr = atomicfile.WriteFile(s.path, out, 0o600)
	}
	s.mu.Lock()
	s.refresh = newRT
	if werr == nil {
		s.fileAccess, s.fileRefresh = tr.AccessToken, newRT
	}
	s.setCurLocked(cred, lt)
	s.mu.Unlock()

	attrs := []any{"expires_at", cred.Expiry, "forced", forced}
	if !old.Expiry.IsZero() {
		attrs = append(attrs, "replaced_expires_in", old.Expiry.Sub(now).Round(time.Millisecond).String())
	}
	s.logger.InfoContext(ctx, "access token refreshed", attrs...)
	if werr != nil {
		// Keep using the rotated refresh token, but say loudly that other
		// users of the file will be refused.
		s.logger.ErrorContext(ctx, "rotated tokens not written back; other programs sharing the file must sign in again", "err", werr)
	}
	return cred
}

// loginRequired records rt as dead, tells the user once and fails (or keeps
// serving a still-valid token; see afterDead).
func (s *RefreshingFile) loginRequired(ctx context.Context, rejected, rt codexauth.Secret, reason string) (codexauth.Credential, error) {
	err := fmt.Errorf("codex auth file %s: %w (%s)", s.path, ErrLoginRequired, reason)
	s.mu.Lock()
	s.dead, s.deadErr = rt, err
	if rt == "" {
		s.dead = s.refresh // empty too: the state is "no usable refresh token"
	}
	s.mu.Unlock()
	s.noticeOnce(ctx, "login", fmt.Sprintf(
		"clodex: the ChatGPT sign-in in %s can no longer be refreshed (%s); run `codex login` to sign in again", s.path, reason))
	return s.afterDead(rejected)
}

// afterDead answers a caller while the refresh token is dead: a token that
// was not rejected and has not expired is still served; otherwise the
// ErrLoginRequired error.
func (s *RefreshingFile) afterDead(rejected codexauth.Secret) (codexauth.Credential, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cur
	if rejected == "" && c.AccessToken != s.rejected && unexpired(c, s.clock()) {
		return c, nil
	}
	if s.deadErr == nil {
		return codexauth.Credential{}, fmt.Errorf("codex auth file %s: %w", s.path, ErrLoginRequired)
	}
	return codexauth.Credential{}, s.deadErr
}

// fallback handles a transient refresh failure: a token that was not
// rejected and has not expired is still served (the failure is logged);
// otherwise err is returned.
func (s *RefreshingFile) fallback(ctx context.Context, rejected codexauth.Secret, err error) (codexauth.Credential, error) {
	s.mu.Lock()
	c := s.cur
	ok := rejected == "" && c.AccessToken != s.rejected && unexpired(c, s.clock())
	s.mu.Unlock()
	if !ok {
		return codexauth.Credential{}, err
	}
	s.logger.WarnContext(ctx, "token refresh failed; using the current access token until it expires", "expires_at", c.Expiry, "err", err)
	return c, nil
}

// reread is renew in RefreshNever mode: the file is the only source of new
// tokens.
func (s *RefreshingFile) reread(ctx context.Context, rejected codexauth.Secret) (codexauth.Credential, error) {
	now := s.clock()
	s.mu.Lock()
	skip := rejected == "" && !s.lastRead.IsZero() && now.Sub(s.lastRead) < minRereadInterval
	s.mu.Unlock()
	if !skip {
		_, f, err := s.readFile()
		s.mu.Lock()
		s.lastRead = now
		s.mu.Unlock()
		if err != nil {
			s.logger.WarnContext(ctx, "re-read codex auth file", "err", err)
		} else if fc, ok := s.adoptFromFile(f, now, true); ok {
			s.logger.InfoContext(ctx, "adopted the access token found in the file", "expires_at", fc.Expiry)
			return fc, nil
		}
	}
	s.mu.Lock()
	c := s.cur
	ok := rejected == "" && c.AccessToken != s.rejected && unexpired(c, now)
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	s.noticeOnce(ctx, "never", fmt.Sprintf(
		"clodex: the access token in %s was rejected or has expired, and this data plane does not refresh it (--refresh=never, the default in a fleet); "+
			"one designated host or the operator must refresh the file (run `codex login`, or run one data plane with --refresh=auto) and copy it here", s.path))
	if rejected != "" {
		return codexauth.Credential{}, fmt.Errorf("codex auth file %s: %w and %w; one designated host or the operator must refresh it", s.path, ErrTokenUnchanged, ErrRefreshDisabled)
	}
	return codexauth.Credential{}, fmt.Errorf("codex auth file %s: the access token has expired and %w; one designated host or the operator must refresh it", s.path, ErrRefreshDisabled)
}

// noticeOnce gives the user msg once per key until the token changes.
func (s *RefreshingFile) noticeOnce(ctx context.Context, key, msg string) {
	s.mu.Lock()
	if s.noticed[key] {
		s.mu.Unlock()
		return
	}
	if s.noticed == nil {
		s.noticed = make(map[string]bool)
	}
	s.noticed[key] = true
	s.mu.Unlock()
	s.logger.WarnContext(ctx, msg)
	if s.notify != nil {
		s.notify(msg)
	}
}

// postRefresh redeems refreshToken at the source's token endpoint.
func (s *RefreshingFile) postRefresh(ctx context.Context, refreshToken codexauth.Secret) (codexauth.TokenResponse, error) {
	return codexauth.Redeem(ctx, s.client, s.endpoint, s.clientID, refreshToken)
}
