package simauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

var (
	b64       = base64.RawURLEncoding
	b64Strict = base64.RawURLEncoding.Strict() // rejects non-canonical encodings
)

// jwtHeader is the JOSE header of every token the Authority signs.
type jwtHeader struct {
	Alg string `json:"alg"`
	Typ string `json:"typ"`
	Kid string `json:"kid"`
}

// authClaims is the namespaced "https://api.openai.com/auth" claim.
type authClaims struct {
	ChatGPTAccountID string `json:"chatgpt_account_id"`
	ChatGPTPlanType  string `json:"chatgpt_plan_type"`
	ChatGPTUserID    string `json:"chatgpt_user_id"`
	UserID           string `json:"user_id"`
}

// profileClaims is the "https://api.openai.com/profile" claim of access tokens.
type profileClaims struct {
	Email         string `json:"email"`
	EmailVerified bool   `json:"email_verified"`
}

// claims is the payload of access and id tokens. Like real tokens, the
// account id is only in the nested auth claim, never at the top level.
type claims struct {
	Iss           string         `json:"iss"`
	Aud           []string       `json:"aud"`
	Sub           string         `json:"sub"`
	Iat           int64          `json:"iat"`
	Nbf           int64          `json:"nbf,omitempty"`
	Exp           int64          `json:"exp"`
	Jti           string         `json:"jti"`
	Email         string         `json:"email"`
	EmailVerified bool           `json:"email_verified"`
	Auth          authClaims     `json:"https://api.openai.com/auth"`
	Profile       *profileClaims `json:"https://api.openai.com/profile,omitempty"`
	Scp           []string       `json:"scp,omitempty"`
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	// crypto/rand.Read never returns an error on supported platforms.
	_, _ = io.ReadFull(rand.Reader, b)
	return b
}

func randomHex(n int) string { return hex.EncodeToString(randomBytes(n)) }

// userID derives a stable, non-secret user id from an account id.
func userID(accountID string) string {
	sum := sha256.Sum256([]byte("clodex-sim-user:" + accountID))
	return "user-" + hex.EncodeToString(sum[:12])
}

// email is the synthetic address of an account.
func email(accountID string) string { return accountID + "@clodex-sim.invalid" }

// newClaims builds the claims of an access (access=true) or id token.
func newClaims(accountID string, now time.Time, ttl time.Duration, access bool) claims {
	iat := now.Unix()
	uid := userID(accountID)
	c := claims{
		Iss:           Issuer,
		Sub:           uid,
		Iat:           iat,
		Exp:           iat + int64(ttl/time.Second),
		Jti:           randomHex(16),
		Email:         email(accountID),
		EmailVerified: true,
		Auth: authClaims{
			ChatGPTAccountID: accountID,
			ChatGPTPlanType:  PlanType,
			ChatGPTUserID:    uid,
			UserID:           uid,
		},
	}
	if access {
		c.Aud = []string{AccessAudience}
		c.Nbf = iat
		c.Profile = &profileClaims{Email: c.Email, EmailVerified: true}
		c.Scp = []string{"openid", "profile", "email", "offline_access"}
	} else {
		c.Aud = []string{ClientID}
	}
	return c
}

// sign returns the compact HS256 JWS of c.
func (a *Authority) sign(c claims) (string, error) {
	h, err := json.Marshal(jwtHeader{Alg: "HS256", Typ: "JWT", Kid: a.kid})
	if err != nil {
		return "", fmt.Errorf("encode jwt header: %w", err)
	}
	p, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode jwt claims: %w", err)
	}
	signingInput := b64.EncodeToString(h) + "." + b64.EncodeToString(p)
	return signingInput + "." + b64.EncodeToString(a.mac(signingInput)), nil
}

func (a *Authority) mac(signingInput string) []byte {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(signingInput))
	return m.Sum(nil)
}

// Validate checks a bearer token (without the "Bearer " prefix) and returns
// its ChatGPT account id. Tokens in Config.Accept are accepted as they are.
// Otherwise the token must be an access token this Authority signed: an
// expired one gives an error matching ErrExpired, anything else that is
// wrong (bad format, bad signature, an id token, a foreign issuer) one
// matching ErrInvalid. Errors never contain the token.
func (a *Authority) Validate(bearer string) (accountID string, err error) {
	if acct, ok := a.acceptLookup(bearer); ok {
		return acct, nil
	}
	c, err := a.verify(bearer)
	if err != nil {
		return "", err
	}
	if len(c.Aud) != 1 || c.Aud[0] != AccessAudience {
		return "", fmt.Errorf("check audience: not an access token: %w", ErrInvalid)
	}
	if !a.clock().Before(time.Unix(c.Exp, 0)) {
		return "", fmt.Errorf("check exp: %w", ErrExpired)
	}
	return c.Auth.ChatGPTAccountID, nil
}

// acceptLookup finds bearer in the configured tokens, comparing in constant
// time per entry.
func (a *Authority) acceptLookup(bearer string) (string, bool) {
	if bearer == "" {
		return "", false
	}
	var found string
	ok := false
	for tok, acct := range a.accept {
		if subtle.ConstantTimeCompare([]byte(tok), []byte(bearer)) == 1 {
			found, ok = acct, true
		}
	}
	return found, ok
}

// verify checks format and signature and decodes the claims.
func (a *Authority) verify(tok string) (claims, error) {
	var c claims
	if tok == "" {
		return c, fmt.Errorf("parse token: empty: %w", ErrInvalid)
	}
	if len(tok) > 16<<10 {
		return c, fmt.Errorf("parse token: longer than 16 KiB: %w", ErrInvalid)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return c, fmt.Errorf("parse token: want 3 dot-separated segments, have %d: %w", len(parts), ErrInvalid)
	}
	hb, err := b64Strict.DecodeString(parts[0])
	if err != nil {
		return c, fmt.Errorf("parse token header: not base64url: %w", ErrInvalid)
	}
	var h jwtHeader
	if err := json.Unmarshal(hb, &h); err != nil {
		return c, fmt.Errorf("parse token header: not JSON: %w", ErrInvalid)
	}
	if h.Alg != "HS256" {
		return c, fmt.Errorf("check token header: alg %q not accepted, want HS256: %w", h.Alg, ErrInvalid)
	}
	sig, err := b64Strict.DecodeString(parts[2])
	if err != nil {
		return c, fmt.Errorf("parse token signature: not base64url: %w", ErrInvalid)
	}
	if !hmac.Equal(sig, a.mac(parts[0]+"."+parts[1])) {
		return c, fmt.Errorf("check token signature: not signed by this authority: %w", ErrInvalid)
	}
	pb, err := b64Strict.DecodeString(parts[1])
	if err != nil {
		return c, fmt.Errorf("parse token claims: not base64url: %w", ErrInvalid)
	}
	dec := json.NewDecoder(bytes.NewReader(pb))
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("parse token claims: not JSON: %w", ErrInvalid)
	}
	if c.Iss != Issuer || c.Auth.ChatGPTAccountID == "" || c.Exp == 0 {
		return c, fmt.Errorf("check token claims: missing iss, exp or account id: %w", ErrInvalid)
	}
	return c, nil
}
