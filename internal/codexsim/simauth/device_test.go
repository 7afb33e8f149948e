package simauth

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

const deviceCallback = "https://auth.openai.com/deviceauth/callback"

// startLogin runs step 1 of the device flow and returns id and user code.
func startLogin(t *testing.T, e *testEnv) (string, string) {
	t.Helper()
	r := e.postJSON(t, "/api/accounts/deviceauth/usercode", map[string]string{"client_id": ClientID})
	if r.status != http.StatusOK {
		t.Fatalf("usercode: status %d, want 200; body %s", r.status, r.raw)
	}
	if got := str(t, r.body, "interval"); got != "1" {
		t.Errorf(`interval = %q, want "1" (a string, as the real endpoint sends)`, got)
	}
	if got, _ := r.body["expires_in"].(float64); got != 900 {
		t.Errorf("expires_in = %v, want 900", r.body["expires_in"])
	}
	return str(t, r.body, "device_auth_id"), str(t, r.body, "user_code")
}

func poll(t *testing.T, e *testEnv, id, code string) reply {
	t.Helper()
	return e.postJSON(t, "/api/accounts/deviceauth/token", map[string]string{"device_auth_id": id, "user_code": code})
}

func exchange(t *testing.T, e *testEnv, code, verifier string) reply {
	t.Helper()
	return e.postForm(t, "/oauth/token", url.Values{
		"grant_type":    {"authorization_code"},
		"code":          {code},
		"redirect_uri":  {deviceCallback},
		"client_id":     {ClientID},
		"code_verifier": {verifier},
	})
}

func TestDeviceFlowAutoApprove(t *testing.T) {
	e := newEnv(t, Config{})
	id, code := startLogin(t, e)

	// First poll: pending (and, in the emulator, approves the login).
	if r := poll(t, e, id, code); r.status != http.StatusForbidden {
		t.Fatalf("first poll: status %d, want 403 pending; body %s", r.status, r.raw)
	}
	r := poll(t, e, id, code)
	if r.status != http.StatusOK {
		t.Fatalf("second poll: status %d, want 200; body %s", r.status, r.raw)
	}
	authCode, verifier := str(t, r.body, "authorization_code"), str(t, r.body, "code_verifier")
	sum := sha256.Sum256([]byte(verifier))
	if got, want := str(t, r.body, "code_challenge"), base64.RawURLEncoding.EncodeToString(sum[:]); got != want {
		t.Errorf("code_challenge = %q, want S256 of the verifier %q", got, want)
	}

	tr := exchange(t, e, authCode, verifier)
	if tr.status != http.StatusOK {
		t.Fatalf("exchange: status %d, want 200; body %s", tr.status, tr.raw)
	}
	acct, err := e.a.Validate(str(t, tr.body, "access_token"))
	if err != nil || acct != "acct-sim" {
		t.Fatalf("Validate(device access token) = %q, %v; want acct-sim, nil", acct, err)
	}
	// The new family refreshes normally.
	if rr := e.refresh(t, str(t, tr.body, "refresh_token")); rr.status != http.StatusOK {
		t.Errorf("refresh of device-login token: status %d; body %s", rr.status, rr.raw)
	}
	// The code is single-use; the login is gone.
	if again := exchange(t, e, authCode, verifier); again.status != http.StatusBadRequest || codexRefreshErrorCode(again.raw) != "invalid_grant" {
		t.Errorf("second exchange: status %d body %s, want 400 invalid_grant", again.status, again.raw)
	}
	if again := poll(t, e, id, code); again.status != http.StatusNotFound {
		t.Errorf("poll after completion: status %d, want 404", again.status)
	}
}

func TestDeviceFlowManualApproval(t *testing.T) {
	e := newEnv(t, Config{ManualApproval: true, DeviceAccountID: "acct-default"})
	id, code := startLogin(t, e)
	for i := range 3 {
		if r := poll(t, e, id, code); r.status != http.StatusForbidden {
			t.Fatalf("poll %d before approval: status %d, want 403", i, r.status)
		}
	}
	// Users type codes in any case.
	if err := e.a.Approve(strings.ToLower(code), "acct-chosen"); err != nil {
		t.Fatalf("Approve: %v", err)
	}
	r := poll(t, e, id, code)
	if r.status != http.StatusOK {
		t.Fatalf("poll after approval: status %d; body %s", r.status, r.raw)
	}
	tr := exchange(t, e, str(t, r.body, "authorization_code"), str(t, r.body, "code_verifier"))
	if acct, err := e.a.Validate(str(t, tr.body, "access_token")); err != nil || acct != "acct-chosen" {
		t.Fatalf("Validate = %q, %v; want acct-chosen", acct, err)
	}
}

func TestDevicePageApproves(t *testing.T) {
	e := newEnv(t, Config{ManualApproval: true})
	id, code := startLogin(t, e)

	page := e.do(t, http.MethodGet, "/codex/device?user_code="+url.QueryEscape(code), "", "", nil)
	if page.status != http.StatusOK || !strings.Contains(page.raw, `value="`+code+`"`) {
		t.Fatalf("GET /codex/device: status %d, want 200 with the code filled in; body %s", page.status, page.raw)
	}
	bad := e.postForm(t, "/codex/device", url.Values{"user_code": {"NOPE-NOPE"}})
	if bad.status != http.StatusBadRequest || !strings.Contains(bad.raw, "is not pending") {
		t.Errorf("unknown code: status %d, want 400 saying it is not pending; body %s", bad.status, bad.raw)
	}
	ok := e.postForm(t, "/codex/device", url.Values{"user_code": {code}, "account_id": {"acct-page"}})
	if ok.status != http.StatusOK || !strings.Contains(ok.raw, "Approved for account acct-page") {
		t.Fatalf("approve: status %d; body %s", ok.status, ok.raw)
	}
	r := poll(t, e, id, code)
	tr := exchange(t, e, str(t, r.body, "authorization_code"), str(t, r.body, "code_verifier"))
	if acct, err := e.a.Validate(str(t, tr.body, "access_token")); err != nil || acct != "acct-page" {
		t.Fatalf("Validate = %q, %v; want acct-page", acct, err)
	}
}

func TestDevicePollErrors(t *testing.T) {
	e := newEnv(t, Config{})
	id, code := startLogin(t, e)
	tests := []struct {
		name       string
		body       map[string]string
		wantStatus int
		wantParam  string
	}{
		{"unknown id", map[string]string{"device_auth_id": "deviceauth_nope", "user_code": code}, http.StatusNotFound, "device_auth_id"},
		{"wrong user code", map[string]string{"device_auth_id": id, "user_code": "AAAA-BBBBB"}, http.StatusBadRequest, "user_code"},
		{"missing user code", map[string]string{"device_auth_id": id}, http.StatusBadRequest, "user_code"},
		{"missing id", map[string]string{"user_code": code}, http.StatusBadRequest, "device_auth_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.postJSON(t, "/api/accounts/deviceauth/token", tt.body)
			if r.status != tt.wantStatus {
				t.Fatalf("status %d, want %d; body %s", r.status, tt.wantStatus, r.raw)
			}
			if got := errParam(r); got != tt.wantParam {
				t.Errorf("error.param = %q, want %q; body %s", got, tt.wantParam, r.raw)
			}
		})
	}

	t.Run("expired", func(t *testing.T) {
		e.clock.Advance(15 * time.Minute)
		if r := poll(t, e, id, code); r.status != http.StatusGone {
			t.Errorf("poll after 15m: status %d, want 410; body %s", r.status, r.raw)
		}
		if err := e.a.Approve(code, "acct-x"); err == nil {
			t.Error("Approve of an expired login = nil, want an error")
		}
	})
}

func TestCodeExchangeErrors(t *testing.T) {
	tests := []struct {
		name      string
		mutate    func(v url.Values)
		wantCode  string
		wantParam string
	}{
		{"wrong verifier", func(v url.Values) { v.Set("code_verifier", "not-the-verifier") }, "invalid_grant", "code_verifier"},
		{"unknown code", func(v url.Values) { v.Set("code", "ac_unknown") }, "invalid_grant", "code"},
		{"other client", func(v url.Values) { v.Set("client_id", "app_other") }, "invalid_grant", "client_id"},
		{"bad redirect", func(v url.Values) { v.Set("redirect_uri", "https://evil.example/cb") }, "invalid_request", "redirect_uri"},
		{"missing verifier", func(v url.Values) { v.Del("code_verifier") }, "invalid_request", "code_verifier"},
		{"missing redirect", func(v url.Values) { v.Del("redirect_uri") }, "invalid_request", "redirect_uri"},
		{"missing code", func(v url.Values) { v.Del("code") }, "invalid_request", "code"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			id, code := startLogin(t, e)
			poll(t, e, id, code)
			g := poll(t, e, id, code)
			v := url.Values{
				"grant_type":    {"authorization_code"},
				"code":          {str(t, g.body, "authorization_code")},
				"redirect_uri":  {deviceCallback},
				"client_id":     {ClientID},
				"code_verifier": {str(t, g.body, "code_verifier")},
			}
			tt.mutate(v)
			r := e.postForm(t, "/oauth/token", v)
			if r.status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400; body %s", r.status, r.raw)
			}
			if got := codexRefreshErrorCode(r.raw); got != tt.wantCode {
				t.Errorf("code = %q, want %q", got, tt.wantCode)
			}
			if got := errParam(r); got != tt.wantParam {
				t.Errorf("param = %q, want %q", got, tt.wantParam)
			}
		})
	}
}

func TestApproveErrors(t *testing.T) {
	e := newEnv(t, Config{ManualApproval: true})
	_, code := startLogin(t, e)
	if err := e.a.Approve(code, "bad account"); err == nil || !strings.Contains(err.Error(), "account id") {
		t.Errorf("Approve with a bad account = %v, want an error naming the account id", err)
	}
	if err := e.a.Approve("ZZZZ-ZZZZZ", "acct-x"); err == nil {
		t.Error("Approve of an unknown code = nil, want an error")
	}
}

// errParam returns error.param of an OpenAI error envelope ("" when null).
func errParam(r reply) string {
	e, _ := r.body["error"].(map[string]any)
	p, _ := e["param"].(string)
	return p
}

func TestDevicePendingCap(t *testing.T) {
	e := newEnv(t, Config{})
	for i := range maxPendingDevices {
		if _, err := e.a.startDevice(ClientID); err != nil {
			t.Fatalf("startDevice %d: %v", i, err)
		}
	}
	r := e.postJSON(t, "/api/accounts/deviceauth/usercode", map[string]string{"client_id": ClientID})
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("login beyond the cap: status %d, want 429; body %s", r.status, r.raw)
	}
	e.clock.Advance(deviceCodeTTL)
	startLogin(t, e) // expired logins were pruned
}
