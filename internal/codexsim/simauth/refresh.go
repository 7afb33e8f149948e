package simauth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// minPrune is the refresh-table size below which expired entries are kept.
const minPrune = 1024

// family is one login's chain of refresh tokens. Revoking it invalidates
// every token in the chain, including the newest.
type family struct {
	id        string // random, safe to log
	accountID string
	revoked   bool
}

// refreshEntry is one refresh token, stored by hash only.
type refreshEntry struct {
	fam       *family
	used      bool // rotated: presenting it again is reuse
	expiresAt time.Time
}

// refreshFailure is why a refresh_token grant was refused. Its code is what
// Codex CLI classifies (refresh_token_expired, refresh_token_reused,
// refresh_token_invalidated).
type refreshFailure struct {
	code    string
	message string
}

func (f *refreshFailure) Error() string { return "refresh token: " + f.code }

var (
	failReused = &refreshFailure{
		code:    "refresh_token_reused",
		message: "Your refresh token has already been used to generate a new access token. Please try signing in again.",
	}
	failExpired = &refreshFailure{
		code:    "refresh_token_expired",
		message: "Your refresh token has expired. Please try signing in again.",
	}
	failInvalidated = &refreshFailure{
		code:    "refresh_token_invalidated",
		message: "Your refresh token has been invalidated. Please try signing in again.",
	}
)

func hashToken(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// Issue starts a new refresh-token family for accountID and returns its first
// token set, as a completed login would.
func (a *Authority) Issue(accountID string) (Tokens, error) {
	if err := checkAccountID(accountID); err != nil {
		return Tokens{}, fmt.Errorf("issue tokens: %w", err)
	}
	fam := &family{id: "fam_" + randomHex(8), accountID: accountID}
	a.mu.Lock()
	t, err := a.issueLocked(fam, a.clock())
	a.mu.Unlock()
	if err != nil {
		return Tokens{}, fmt.Errorf("issue tokens: %w", err)
	}
	a.logger.Info("tokens issued", "family", fam.id, "account_id", accountID)
	return t, nil
}

// issueLocked signs new access and id tokens and adds a fresh refresh token
// to fam.
func (a *Authority) issueLocked(fam *family, now time.Time) (Tokens, error) {
	access, err := a.sign(newClaims(fam.accountID, now, a.tokenTTL, true))
	if err != nil {
		return Tokens{}, err
	}
	id, err := a.sign(newClaims(fam.accountID, now, a.tokenTTL, false))
	if err != nil {
		return Tokens{}, err
	}
	rt := "rt_" + b64.EncodeToString(randomBytes(32))
	if len(a.refresh) >= a.nextPrune {
		a.pruneLocked(now)
	}
	a.refresh[hashToken(rt)] = &refreshEntry{fam: fam, expiresAt: now.Add(a.refreshTTL)}
	return Tokens{
		AccessToken:  access,
		RefreshToken: rt,
		IDToken:      id,
		ExpiresIn:    int64(a.tokenTTL / time.Second),
		AccountID:    fam.accountID,
	}, nil
}

// pruneLocked drops refresh entries that expired and resets the threshold,
// so the table stays proportional to the live tokens.
func (a *Authority) pruneLocked(now time.Time) {
	for h, e := range a.refresh {
		if now.After(e.expiresAt) {
			delete(a.refresh, h)
		}
	}
	a.nextPrune = max(minPrune, 2*len(a.refresh))
}

// rotate redeems a refresh token: on success the token is marked used and a
// new set from the same family is returned. Presenting a used token again
// revokes the family and fails with failReused.
func (a *Authority) rotate(rt string) (Tokens, string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.clock()
	e, ok := a.refresh[hashToken(rt)]
	switch {
	case !ok:
		return Tokens{}, "", failInvalidated
	case e.used:
		e.fam.revoked = true
		a.stats.RefreshReuseDetected++
		return Tokens{}, e.fam.id, failReused
	case e.fam.revoked:
		return Tokens{}, e.fam.id, failInvalidated
	case !now.Before(e.expiresAt):
		return Tokens{}, e.fam.id, failExpired
	}
	t, err := a.issueLocked(e.fam, now)
	if err != nil {
		return Tokens{}, e.fam.id, err
	}
	e.used = true
	a.stats.TokenRefreshes++
	return t, e.fam.id, nil
}

// RevokeAll invalidates every refresh token issued so far (they then answer
// refresh_token_invalidated; rotated ones still answer refresh_token_reused).
// Access tokens stay valid until they expire, as real JWTs do.
func (a *Authority) RevokeAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.refresh {
		e.fam.revoked = true
	}
	a.logger.Info("all refresh tokens revoked")
}
