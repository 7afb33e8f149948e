package codexauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultIssuer is the OpenAI identity provider's origin, where the
// device-code login runs; its token endpoint is [DefaultTokenEndpoint].
const DefaultIssuer = "https://auth.openai.com"

// DeviceCode is a started device-code login: the user opens
// VerificationURL and enters UserCode while [PollDeviceLogin] waits.
type DeviceCode struct {
	// UserCode is what the user types on the verification page.
	UserCode string
	// VerificationURL is the page where the user signs in and enters the
	// code: <issuer>/codex/device.
	VerificationURL string
	// Interval is the poll interval the issuer asked for.
	Interval time.Duration
	// ExpiresAt bounds the login.
	ExpiresAt time.Time

	id, issuer string
}

// deviceEndpoint joins issuer and path.
func deviceEndpoint(issuer, path string) string { return strings.TrimRight(issuer, "/") + path }

// StartDeviceLogin starts a device-code login at issuer (Codex CLI's flow:
// POST <issuer>/api/accounts/deviceauth/usercode). Errors name the issuer
// and what it answered.
func StartDeviceLogin(ctx context.Context, client *http.Client, issuer, clientID string, now time.Time) (DeviceCode, error) {
	if u, err := url.Parse(issuer); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return DeviceCode{}, fmt.Errorf("device login: issuer %q is not an http or https URL such as %s", issuer, DefaultIssuer)
	}
	var start struct {
		DeviceAuthID string `json:"device_auth_id"`
		UserCode     string `json:"user_code"`
		Interval     string `json:"interval"`
		ExpiresIn    int64  `json:"expires_in"`
	}
	status, body, err := postJSON(ctx, client, deviceEndpoint(issuer, "/api/accounts/deviceauth/usercode"), map[string]string{"client_id": clientID})
	if err != nil {
		return DeviceCode{}, fmt.Errorf("device login: start at %s: %w", issuer, err)
	}
	if status != http.StatusOK {
		return DeviceCode{}, fmt.Errorf("device login: start at %s: issuer answered HTTP %d (%s)", issuer, status, tokenCodeSafe(errorCode(body)))
	}
	if json.Unmarshal(body, &start) != nil || start.DeviceAuthID == "" || start.UserCode == "" {
		return DeviceCode{}, fmt.Errorf("device login: start at %s: the answer is not a device code", issuer)
	}
	interval := 5 * time.Second
	if n, err := strconv.Atoi(start.Interval); err == nil && n > 0 && n <= 60 {
		interval = time.Duration(n) * time.Second
	}
	expires := 15 * time.Minute
	if start.ExpiresIn > 0 {
		expires = time.Duration(start.ExpiresIn) * time.Second
	}
	return DeviceCode{
		UserCode:        start.UserCode,
		VerificationURL: deviceEndpoint(issuer, "/codex/device"),
		Interval:        interval,
		ExpiresAt:       now.Add(expires),
		id:              start.DeviceAuthID,
		issuer:          issuer,
	}, nil
}

// PollDeviceLogin waits until the user approved dc (polling every
// dc.Interval; wait sleeps, honouring ctx), then exchanges the
// authorization code at tokenEndpoint for the sign-in's tokens. It fails
// when the login expires, the issuer refuses it, or ctx ends.
func PollDeviceLogin(ctx context.Context, client *http.Client, dc DeviceCode, tokenEndpoint, clientID string, wait func(context.Context, time.Duration) error) (TokenResponse, error) {
	var grant struct {
		AuthorizationCode string `json:"authorization_code"`
		CodeVerifier      string `json:"code_verifier"`
	}
	for {
		status, body, err := postJSON(ctx, client, deviceEndpoint(dc.issuer, "/api/accounts/deviceauth/token"),
			map[string]string{"device_auth_id": dc.id, "user_code": dc.UserCode})
		if err != nil {
			return TokenResponse{}, fmt.Errorf("device login: poll: %w", err)
		}
		if status == http.StatusOK {
			if json.Unmarshal(body, &grant) != nil || grant.AuthorizationCode == "" || grant.CodeVerifier == "" {
				return TokenResponse{}, errors.New("device login: poll: the answer has no authorization code")
			}
			break
		}
		// 403 and 404 mean "not approved yet" at auth.openai.com.
		if status != http.StatusForbidden && status != http.StatusNotFound {
			return TokenResponse{}, fmt.Errorf("device login: poll: issuer answered HTTP %d (%s); start a new login", status, tokenCodeSafe(errorCode(body)))
		}
		if err := wait(ctx, dc.Interval); err != nil {
			return TokenResponse{}, fmt.Errorf("device login: waiting for approval of code %s: %w", dc.UserCode, err)
		}
	}
	tr, err := postToken(ctx, client, tokenEndpoint, url.Values{
		"grant_type":    {"authorization_code"},
		"code":          {grant.AuthorizationCode},
		"code_verifier": {grant.CodeVerifier},
		"redirect_uri":  {deviceEndpoint(dc.issuer, "/deviceauth/callback")},
		"client_id":     {clientID},
	})
	if err != nil {
		return TokenResponse{}, fmt.Errorf("device login: exchange the authorization code: %w", err)
	}
	if tr.RefreshToken == "" {
		return TokenResponse{}, errors.New("device login: the token endpoint answered without a refresh_token")
	}
	return tr, nil
}

// postJSON posts a JSON object and returns the status and (bounded) body.
// Errors never contain the request body.
func postJSON(ctx context.Context, client *http.Client, endpoint string, v map[string]string) (int, []byte, error) {
	b, _ := json.Marshal(v) // a map of strings always marshals
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(b))
	if err != nil {
		return 0, nil, errors.New("build request")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "clodex")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenResponse))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, body, nil
}
