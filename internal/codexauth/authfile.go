package codexauth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// AuthFile is the Codex CLI's auth.json:
//
//	{"auth_mode":"chatgpt","OPENAI_API_KEY":null,
//	 "tokens":{"id_token":…,"access_token":…,"refresh_token":…,"account_id":…},
//	 "last_refresh":"2026-…Z"}
//
// Unknown fields are tolerated: the file belongs to Codex CLI.
type AuthFile struct {
	AuthMode    string      `json:"auth_mode"`
	Tokens      *AuthTokens `json:"tokens"`
	LastRefresh string      `json:"last_refresh,omitempty"`
}

// AuthTokens is the "tokens" object of an [AuthFile].
type AuthTokens struct {
	IDToken      Secret `json:"id_token"`
	AccessToken  Secret `json:"access_token"`
	RefreshToken Secret `json:"refresh_token"`
	AccountID    string `json:"account_id,omitempty"`
}

// ParseAuthFile decodes and checks an auth.json document. name is used in
// error messages only (usually the path). It requires ChatGPT mode and a
// non-empty access token; errors never contain a token.
func ParseAuthFile(name string, data []byte) (*AuthFile, error) {
	var f AuthFile
	if err := json.Unmarshal(data, &f); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return nil, fmt.Errorf("codex auth file %s: not valid JSON (offset %d)", name, syn.Offset)
		case errors.As(err, &typ):
			return nil, fmt.Errorf("codex auth file %s: field %q has the wrong type: want a %s", name, typ.Field, typ.Type)
		default:
			return nil, fmt.Errorf("codex auth file %s: not a JSON object", name)
		}
	}
	if f.AuthMode != "" && f.AuthMode != "chatgpt" {
		return nil, fmt.Errorf("codex auth file %s: auth_mode is %q; clodex needs a ChatGPT sign-in (auth_mode \"chatgpt\"); run `codex login`", name, f.AuthMode)
	}
	if f.Tokens == nil {
		return nil, fmt.Errorf("codex auth file %s: no \"tokens\" object; sign in with `codex login` (ChatGPT mode)", name)
	}
	if strings.TrimSpace(f.Tokens.AccessToken.Reveal()) == "" {
		return nil, fmt.Errorf("codex auth file %s: tokens.access_token is missing or empty", name)
	}
	return &f, nil
}

// Credential derives the credential from the file's tokens: the account id
// comes from the access token's claims (docs/credentials.md §2), falling back to
// tokens.account_id.
func (f *AuthFile) Credential() Credential {
	c := Credential{AccessToken: f.Tokens.AccessToken}
	claims, err := ParseClaims(f.Tokens.AccessToken)
	if err == nil {
		c.AccountID = claims.AccountID
		c.Expiry = claims.Expiry
	}
	if c.AccountID == "" {
		c.AccountID = f.Tokens.AccountID
	}
	return c
}

// Claims are the parts of a ChatGPT JWT the data plane reads.
type Claims struct {
	// AccountID is the first present of chatgpt_account_id,
	// "https://api.openai.com/auth".chatgpt_account_id and
	// organizations[0].id.
	AccountID string
	// Expiry is the exp claim; zero when absent.
	Expiry time.Time
}

// ErrOpaqueToken reports a token that is not a JWT (no claims to read).
var ErrOpaqueToken = errors.New("token is not a JWT")

// ParseClaims reads the payload of a JWT without verifying its signature.
// It returns ErrOpaqueToken for a token without three dot-separated
// segments. Errors never contain the token.
func ParseClaims(token Secret) (Claims, error) {
	parts := strings.Split(token.Reveal(), ".")
	if len(parts) != 3 {
		return Claims{}, ErrOpaqueToken
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return Claims{}, errors.New("parse token claims: payload is not base64url")
	}
	var raw struct {
		AccountID string `json:"chatgpt_account_id"`
		Auth      *struct {
			AccountID string `json:"chatgpt_account_id"`
		} `json:"https://api.openai.com/auth"`
		Organizations []struct {
			ID string `json:"id"`
		} `json:"organizations"`
		Exp json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return Claims{}, errors.New("parse token claims: payload is not a JSON object of the expected shape")
	}
	var c Claims
	switch {
	case raw.AccountID != "":
		c.AccountID = raw.AccountID
	case raw.Auth != nil && raw.Auth.AccountID != "":
		c.AccountID = raw.Auth.AccountID
	case len(raw.Organizations) > 0 && raw.Organizations[0].ID != "":
		c.AccountID = raw.Organizations[0].ID
	}
	if raw.Exp != "" {
		if f, err := raw.Exp.Float64(); err == nil && f > 0 {
			c.Expiry = time.Unix(int64(f), 0).UTC()
		}
	}
	return c, nil
}

// TokenLifetime is exp - iat of a JWT; 0 when either is missing.
func TokenLifetime(token Secret) time.Duration {
	parts := strings.Split(token.Reveal(), ".")
	if len(parts) != 3 {
		return 0
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return 0
	}
	var c struct {
		Iat, Exp json.Number
	}
	if json.Unmarshal(payload, &c) != nil {
		return 0
	}
	iat, err1 := c.Iat.Float64()
	exp, err2 := c.Exp.Float64()
	if err1 != nil || err2 != nil || iat <= 0 || exp <= iat {
		return 0
	}
	return time.Duration((exp - iat) * float64(time.Second))
}
