package accounts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/filelock"
)

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
