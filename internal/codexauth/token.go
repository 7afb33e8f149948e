package codexauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Refresh failure codes the identity provider sends (error.code) that mean
// the refresh token is dead: the user has to sign in again.
const (
	codeRefreshReused      = "refresh_token_reused"
	codeRefreshExpired     = "refresh_token_expired"
	codeRefreshInvalidated = "refresh_token_invalidated"
)

// maxTokenResponse bounds the token endpoint's answer that is read.
const maxTokenResponse = 1 << 20

// TokenResponse is the token endpoint's 200 answer. Its tokens are
// [Secret]s: printing or logging it redacts them.
type TokenResponse struct {
	AccessToken  Secret `json:"access_token"`
	RefreshToken Secret `json:"refresh_token"`
	IDToken      Secret `json:"id_token"`
	ExpiresIn    *int64 `json:"expires_in"`
}

// refreshError is a refused or failed refresh. It never holds a token.
type refreshError struct {
	status int    // HTTP status; 0 for a transport error
	code   string // the error code of the answer, if any
	err    error  // transport or decoding error, if any
	// permanent: the refresh token is dead (never retry it; sign in again).
	permanent bool
}

func (e *refreshError) Error() string {
	switch {
	case e.err != nil && e.status == 0:
		return "refresh access token: " + e.err.Error()
	case e.err != nil:
		return fmt.Sprintf("refresh access token: token endpoint answered HTTP %d: %v", e.status, e.err)
	case e.code != "":
		return fmt.Sprintf("refresh access token: token endpoint answered HTTP %d (%s)", e.status, e.code)
	}
	return fmt.Sprintf("refresh access token: token endpoint answered HTTP %d", e.status)
}

func (e *refreshError) Unwrap() error { return e.err }

// LoginRequired reports whether err is a refusal meaning the refresh token
// is dead for good (refresh_token_reused, refresh_token_expired,
// refresh_token_invalidated, invalid_grant, any 401): it must never be
// presented again, and the user has to sign in again. reason is the
// refusal's code, or "HTTP <status>"; it never contains a token.
func LoginRequired(err error) (reason string, ok bool) {
	var re *refreshError
	if !errors.As(err, &re) || !re.permanent {
		return "", false
	}
	if re.code != "" {
		return re.code, true
	}
	return fmt.Sprintf("HTTP %d", re.status), true
}

// errorCode extracts the error code of a failed token response the way
// Codex CLI does: error.code when error is an object, else error when it is
// a string (the OAuth form, e.g. "invalid_grant"), else a top-level code.
func errorCode(body []byte) string {
	var v struct {
		Error json.RawMessage `json:"error"`
		Code  any             `json:"code"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	if len(v.Error) > 0 {
		var obj struct {
			Code any `json:"code"`
		}
		if json.Unmarshal(v.Error, &obj) == nil {
			if s, ok := obj.Code.(string); ok && s != "" {
				return s
			}
		}
		var s string
		if json.Unmarshal(v.Error, &s) == nil && s != "" {
			return s
		}
	}
	if s, ok := v.Code.(string); ok {
		return s
	}
	return ""
}

// permanentCode reports whether a refusal means the refresh token can never
// work again.
func permanentCode(status int, code string) bool {
	switch code {
	case codeRefreshReused, codeRefreshExpired, codeRefreshInvalidated, "invalid_grant":
		return true
	}
	// Codex CLI treats any 401 from the token endpoint as final too:
	// presenting the same refresh token again could only trip reuse
	// detection.
	return status == http.StatusUnauthorized
}

// tokenCodeSafe keeps an error code fit to log: short and plain.
func tokenCodeSafe(code string) string {
	if len(code) > 64 || strings.IndexFunc(code, func(r rune) bool {
		return !(r == '_' || r == '-' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) >= 0 {
		return "unrecognised"
	}
	return code
}

// Redeem redeems refreshToken at the token endpoint (docs/credentials.md
// §4): form grant_type=refresh_token, refresh_token, client_id; Accept
// application/json. A refusal that means the refresh token is dead is
// reported by [LoginRequired]. Errors never contain a token. Every holder
// of a rotating refresh token (the data plane's [RefreshingFile], the
// control plane's credential broker) redeems it here.
func Redeem(ctx context.Context, client *http.Client, endpoint, clientID string, refreshToken Secret) (TokenResponse, error) {
	return postToken(ctx, client, endpoint, url.Values{
		"grant_type":    {"refresh_token"},
		"refresh_token": {refreshToken.Reveal()},
		"client_id":     {clientID},
	})
}

// postToken posts form to the token endpoint and reads a token answer.
// Errors are *refreshError and never contain a token.
func postToken(ctx context.Context, client *http.Client, endpoint string, form url.Values) (TokenResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return TokenResponse{}, &refreshError{err: errors.New("build request")}
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "clodex")
	resp, err := client.Do(req)
	if err != nil {
		// *url.Error names the method and URL only; the form is in the body.
		return TokenResponse{}, &refreshError{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse))
	if err != nil {
		return TokenResponse{}, &refreshError{status: resp.StatusCode, err: fmt.Errorf("read answer: %w", err)}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		code := tokenCodeSafe(errorCode(body))
		return TokenResponse{}, &refreshError{
			status:    resp.StatusCode,
			code:      code,
			permanent: permanentCode(resp.StatusCode, code),
		}
	}
	var tr TokenResponse
	if err := json.Unmarshal(body, &tr); err != nil {
		return TokenResponse{}, &refreshError{status: resp.StatusCode, err: errors.New("answer is not the expected JSON object")}
	}
	if strings.TrimSpace(tr.AccessToken.Reveal()) == "" {
		return TokenResponse{}, &refreshError{status: resp.StatusCode, err: errors.New("answer has no access_token")}
	}
	if tr.ExpiresIn != nil && *tr.ExpiresIn <= 0 {
		return TokenResponse{}, &refreshError{status: resp.StatusCode, err: fmt.Errorf("answer has expires_in %d; want a positive number of seconds", *tr.ExpiresIn)}
	}
	return tr, nil
}

// ExpiresAt is when a token from tr expires: its exp claim, else now plus
// expires_in; zero when neither is known.
func (tr TokenResponse) ExpiresAt(now time.Time) time.Time {
	if c, err := ParseClaims(tr.AccessToken); err == nil && !c.Expiry.IsZero() {
		return c.Expiry
	}
	if tr.ExpiresIn != nil {
		return now.Add(time.Duration(*tr.ExpiresIn) * time.Second)
	}
	return time.Time{}
}

// Defaults of the OpenAI identity provider and of every refresher.
const (
	// DefaultTokenEndpoint is OpenAI's OAuth token endpoint.
	DefaultTokenEndpoint = "https://auth.openai.com/oauth/token"
	// DefaultClientID is the public OAuth client id of Codex CLI.
	DefaultClientID = "app_EMoamEEZ73f0CkXaXp7hrann"
	// DefaultSkew is how long before expiry a token is refreshed (docs/credentials.md §4).
	DefaultSkew = 120 * time.Second
)

// SkewFor is the refresh margin for a token that lives lifetime (0 when
// unknown): skew, or a quarter of the lifetime when that is less, so a
// short-lived token is not refreshed on every use. This is the one skew
// rule of every refresher (docs/credentials.md §4).
func SkewFor(skew, lifetime time.Duration) time.Duration {
	if lifetime > 0 && lifetime/4 < skew {
		return lifetime / 4
	}
	return skew
}

// Fresh reports whether a token expiring at expiry (zero when unknown)
// that lives lifetime can be used at now without refreshing it first,
// under [SkewFor].
func Fresh(expiry time.Time, lifetime, skew time.Duration, now time.Time) bool {
	return expiry.IsZero() || now.Before(expiry.Add(-SkewFor(skew, lifetime)))
}
