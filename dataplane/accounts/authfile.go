package accounts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
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

// RefreshingFile is the credential of a Codex auth.json that it keeps
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

	mu        sync.Mutex // guards the following fields
	cur       codexauth.Credential
	lifetime  time.Duration    // of cur.AccessToken (exp - iat); 0 when unknown
	refreshAt time.Time        // cur is due for a refresh from then on (its expiry less the skew)
	refresh   codexauth.Secret // the newest refresh token known
	// fileAccess and fileRefresh are the tokens the file held when this
	// source last read or wrote it; a difference means someone else wrote it.
	fileAccess, fileRefresh codexauth.Secret
	rejected                codexauth.Secret // an access token upstream rejected; never handed out again
	dead                    codexauth.Secret // a refresh token refused for good; never presented again
	deadErr                 error            // the ErrLoginRequired error for dead
	lastRead                time.Time
	noticed                 map[string]bool // notices given since the token last changed
}

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
	s.logger = s.logger.With("component", "dataplane/accounts", "path", s.path)
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

// current is the credential last read or refreshed, without a refresh.
func (s *RefreshingFile) current() codexauth.Credential {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Path returns the auth.json the source reads and writes.
func (s *RefreshingFile) Path() string { return s.path }

// Credential returns the current credential,
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

// usableLocked returns the current credential if it needs no refresh:
// codexauth.Fresh of the current token, as setCurLocked computed it.
func (s *RefreshingFile) usableLocked(now time.Time) (codexauth.Credential, bool) {
	c := s.cur
	if c.AccessToken == s.rejected || !c.Expiry.IsZero() && !now.Before(s.refreshAt) {
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
	s.refreshAt = c.Expiry.Add(-codexauth.SkewFor(s.skew, lifetime))
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

// Files is the [Source] of one or several Codex auth.json files
// (--codex-auth, repeated), each its own ChatGPT account refreshed under
// its own file lock.
type Files struct {
	keys  []string // account keys, in flag order
	byKey map[string]*RefreshingFile
}

// FilesError is a set of auth.json files that cannot be served together:
// two of one account, or one without an account id among several.
type FilesError struct{ msg string }

func (e *FilesError) Error() string { return e.msg }

// OpenFiles opens each auth.json (NewFileSource) and reads its account.
// With several files each must name a different ChatGPT account (else a
// *FilesError); one file may name none (its key is then account.Key("")).
func OpenFiles(ctx context.Context, cfgs []FileConfig) (*Files, error) {
	fs := &Files{byKey: make(map[string]*RefreshingFile, len(cfgs))}
	seen := map[string]string{}
	for _, cfg := range cfgs {
		f, err := NewFileSource(cfg)
		if err != nil {
			return nil, err
		}
		cred := f.current()
		if len(cfgs) > 1 {
			// Several accounts: each must be usable, and known, now.
			if cred, err = f.Credential(ctx); err != nil {
				return nil, fmt.Errorf("--codex-auth %s: %w", cfg.Path, err)
			}
		}
		key := account.Key(cred.AccountID)
		if len(cfgs) > 1 {
			if cred.AccountID == "" {
				return nil, &FilesError{fmt.Sprintf("--codex-auth %s has no account id (tokens.account_id); with several --codex-auth files each must name its ChatGPT account", cfg.Path)}
			}
			if prev, dup := seen[key]; dup {
				return nil, &FilesError{fmt.Sprintf("--codex-auth %s and %s hold the same account %s; give each account once", prev, cfg.Path, key)}
			}
			seen[key] = cfg.Path
		}
		fs.keys = append(fs.keys, key)
		fs.byKey[key] = f
	}
	if len(fs.keys) == 0 {
		return nil, errors.New("no --codex-auth file; want at least one Codex auth.json")
	}
	return fs, nil
}

// Accounts returns the files' account keys, in flag order.
func (fs *Files) Accounts(context.Context) ([]string, error) { return fs.keys, nil }

// Credential returns the current credential of the file of the account
// with key.
func (fs *Files) Credential(ctx context.Context, key string) (codexauth.Credential, error) {
	f, ok := fs.byKey[key]
	if !ok {
		return codexauth.Credential{}, fmt.Errorf("account %s is not served by any --codex-auth file", key)
	}
	return f.Credential(ctx)
}

// Rejected forces one refresh of the file of the account with key.
func (fs *Files) Rejected(ctx context.Context, key string, token codexauth.Secret) (codexauth.Credential, error) {
	f, ok := fs.byKey[key]
	if !ok {
		return codexauth.Credential{}, fmt.Errorf("account %s is not served by any --codex-auth file", key)
	}
	return f.Rejected(ctx, token)
}
