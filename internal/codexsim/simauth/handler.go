package simauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"mime"
	"net/http"
	"strings"
)

// maxBodyBytes bounds every request body the handler reads.
const maxBodyBytes = 64 << 10

func (a *Authority) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /oauth/token", a.serveToken)
	mux.HandleFunc("POST /api/accounts/deviceauth/usercode", a.serveDeviceStart)
	mux.HandleFunc("POST /api/accounts/deviceauth/token", a.serveDevicePoll)
	mux.HandleFunc("GET /codex/device", a.serveDevicePage)
	mux.HandleFunc("POST /codex/device", a.serveDeviceApprove)
	mux.HandleFunc("GET /backend-api/wham/accounts/check", a.serveAccountsCheck)
	return mux
}

// apiError is the OpenAI error envelope. Codex CLI reads the refresh failure
// reason from error.code ("refresh_token_reused" and friends).
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes the OpenAI error envelope; param may be "".
func writeError(w http.ResponseWriter, status int, code, param, message string) {
	body := apiError{Error: apiErrorBody{Message: message, Type: "invalid_request_error", Code: code}}
	if param != "" {
		body.Error.Param = &param
	}
	writeJSON(w, status, body)
}

// paramError is a bad or missing request parameter.
type paramError struct {
	status int // 400 unless the body was too large or of the wrong type
	param  string
	msg    string
}

func (e *paramError) Error() string { return e.msg }

func writeParamError(w http.ResponseWriter, err error) {
	var pe *paramError
	if !errors.As(err, &pe) {
		writeError(w, http.StatusBadRequest, "invalid_request", "", err.Error())
		return
	}
	code := "invalid_request"
	if pe.status == http.StatusRequestEntityTooLarge {
		code = "request_too_large"
	}
	writeError(w, pe.status, code, pe.param, pe.msg)
}

// readParams reads a JSON object of strings or a form-encoded body.
// allowForm selects whether form encoding is accepted.
func readParams(w http.ResponseWriter, r *http.Request, allowForm bool) (map[string]string, error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	ct := r.Header.Get("Content-Type")
	mt := ""
	if ct != "" {
		var err error
		mt, _, err = mime.ParseMediaType(ct)
		if err != nil {
			return nil, &paramError{http.StatusBadRequest, "Content-Type", fmt.Sprintf("Content-Type %q is malformed", ct)}
		}
	}
	allowed := "application/json"
	if allowForm {
		allowed = "application/x-www-form-urlencoded or application/json"
	}
	switch {
	case mt == "application/json" || (mt == "" && !allowForm):
		var raw map[string]any
		dec := json.NewDecoder(r.Body)
		if err := dec.Decode(&raw); err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, &paramError{http.StatusRequestEntityTooLarge, "", fmt.Sprintf("request body is larger than %d bytes", maxBodyBytes)}
			}
			return nil, &paramError{http.StatusBadRequest, "", "request body is not a JSON object: " + err.Error()}
		}
		if raw == nil {
			return nil, &paramError{http.StatusBadRequest, "", "request body is not a JSON object"}
		}
		out := make(map[string]string, len(raw))
		for k, v := range raw {
			switch v := v.(type) {
			case string:
				out[k] = v
			case nil:
			default:
				return nil, &paramError{http.StatusBadRequest, k, fmt.Sprintf("parameter %s must be a string", k)}
			}
		}
		return out, nil
	case allowForm && (mt == "application/x-www-form-urlencoded" || mt == ""):
		if mt == "" {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if err := r.ParseForm(); err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, &paramError{http.StatusRequestEntityTooLarge, "", fmt.Sprintf("request body is larger than %d bytes", maxBodyBytes)}
			}
			return nil, &paramError{http.StatusBadRequest, "", "request body is not form-encoded: " + err.Error()}
		}
		out := make(map[string]string, len(r.PostForm))
		for k, vs := range r.PostForm {
			if len(vs) > 0 {
				out[k] = vs[0]
			}
		}
		return out, nil
	default:
		return nil, &paramError{http.StatusUnsupportedMediaType, "Content-Type", fmt.Sprintf("Content-Type %q is not accepted; want %s", mt, allowed)}
	}
}

// require returns the named non-empty parameters or an error naming the
// first missing one.
func require(p map[string]string, names ...string) error {
	for _, n := range names {
		if strings.TrimSpace(p[n]) == "" {
			return &paramError{http.StatusBadRequest, n, fmt.Sprintf("missing required parameter %s", n)}
		}
	}
	return nil
}

// tokenResponse is the 200 answer of the token endpoint.
type tokenResponse struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	IDToken      string `json:"id_token"`
	ExpiresIn    int64  `json:"expires_in"`
	TokenType    string `json:"token_type"`
	Scope        string `json:"scope"`
}

func newTokenResponse(t Tokens) tokenResponse {
	return tokenResponse{
		AccessToken:  t.AccessToken,
		RefreshToken: t.RefreshToken,
		IDToken:      t.IDToken,
		ExpiresIn:    t.ExpiresIn,
		TokenType:    "Bearer",
		Scope:        "openid profile email offline_access",
	}
}

func (a *Authority) serveToken(w http.ResponseWriter, r *http.Request) {
	p, err := readParams(w, r, true)
	if err != nil {
		writeParamError(w, err)
		return
	}
	if err := require(p, "grant_type"); err != nil {
		writeParamError(w, err)
		return
	}
	switch gt := p["grant_type"]; gt {
	case "refresh_token":
		a.serveRefreshGrant(w, r, p)
	case "authorization_code":
		a.serveCodeGrant(w, r, p)
	default:
		writeError(w, http.StatusBadRequest, "unsupported_grant_type", "grant_type",
			fmt.Sprintf("grant_type %q is not supported; want refresh_token or authorization_code", gt))
	}
}

func (a *Authority) serveRefreshGrant(w http.ResponseWriter, r *http.Request, p map[string]string) {
	if err := require(p, "refresh_token", "client_id"); err != nil {
		writeParamError(w, err)
		return
	}
	t, fam, err := a.rotate(p["refresh_token"])
	if err != nil {
		var rf *refreshFailure
		if !errors.As(err, &rf) {
			a.logger.ErrorContext(r.Context(), "refresh failed", "family", fam, "err", err)
			writeError(w, http.StatusInternalServerError, "server_error", "", "token issuance failed")
			return
		}
		if rf == failReused {
			a.logger.WarnContext(r.Context(), "refresh token reuse detected; family revoked", "family", fam, "code", rf.code)
		} else {
			a.logger.InfoContext(r.Context(), "refresh refused", "family", fam, "code", rf.code)
		}
		writeError(w, http.StatusUnauthorized, rf.code, "", rf.message)
		return
	}
	a.logger.InfoContext(r.Context(), "tokens refreshed", "family", fam, "account_id", t.AccountID)
	writeJSON(w, http.StatusOK, newTokenResponse(t))
}

func (a *Authority) serveCodeGrant(w http.ResponseWriter, r *http.Request, p map[string]string) {
	if err := require(p, "code", "code_verifier", "redirect_uri", "client_id"); err != nil {
		writeParamError(w, err)
		return
	}
	if !strings.HasSuffix(p["redirect_uri"], "/deviceauth/callback") {
		writeError(w, http.StatusBadRequest, "invalid_request", "redirect_uri",
			"redirect_uri must be the device callback, <issuer>/deviceauth/callback")
		return
	}
	t, fam, err := a.redeemCode(p["code"], p["code_verifier"], p["client_id"])
	if err != nil {
		a.logger.InfoContext(r.Context(), "authorization code refused", "err", err)
		param := "code"
		switch {
		case errors.Is(err, errCodeVerifier):
			param = "code_verifier"
		case errors.Is(err, errCodeClientMatch):
			param = "client_id"
		}
		writeError(w, http.StatusBadRequest, "invalid_grant", param, err.Error())
		return
	}
	a.logger.InfoContext(r.Context(), "device login completed", "family", fam, "account_id", t.AccountID)
	writeJSON(w, http.StatusOK, newTokenResponse(t))
}

func (a *Authority) serveDeviceStart(w http.ResponseWriter, r *http.Request) {
	p, err := readParams(w, r, false)
	if err != nil {
		writeParamError(w, err)
		return
	}
	if err := require(p, "client_id"); err != nil {
		writeParamError(w, err)
		return
	}
	start, err := a.startDevice(p["client_id"])
	if err != nil {
		writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, start)
}

func (a *Authority) serveDevicePoll(w http.ResponseWriter, r *http.Request) {
	p, err := readParams(w, r, false)
	if err != nil {
		writeParamError(w, err)
		return
	}
	if err := require(p, "device_auth_id", "user_code"); err != nil {
		writeParamError(w, err)
		return
	}
	g, acct, err := a.pollDevice(p["device_auth_id"], p["user_code"])
	switch {
	case err == nil:
		a.logger.InfoContext(r.Context(), "device login approved", "account_id", acct)
		writeJSON(w, http.StatusOK, g)
	case errors.Is(err, errDevicePending):
		writeError(w, http.StatusForbidden, "deviceauth_authorization_pending", "",
			"device authorization is pending; the user has not approved the code yet")
	case errors.Is(err, errDeviceUnknown):
		writeError(w, http.StatusNotFound, "deviceauth_not_found", "device_auth_id",
			"device_auth_id is unknown or its login already completed")
	case errors.Is(err, errDeviceMismatch):
		writeError(w, http.StatusBadRequest, "invalid_request", "user_code", err.Error())
	default: // expired
		writeError(w, http.StatusGone, "deviceauth_expired", "device_auth_id",
			"device authorization expired; start a new login")
	}
}

var devicePage = template.Must(template.New("device").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>clodex-sim device login</title></head>
<body>
<h1>clodex-sim device login</h1>
{{if .Message}}<p>{{.Message}}</p>{{end}}
<form method="post" action="/codex/device">
<label>Code <input name="user_code" value="{{.UserCode}}" autocomplete="off"></label>
<label>Account <input name="account_id" value="{{.AccountID}}"></label>
<button type="submit">Approve</button>
</form>
</body></html>
`))

type devicePageData struct{ Message, UserCode, AccountID string }

func (a *Authority) renderDevicePage(w http.ResponseWriter, status int, d devicePageData) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = devicePage.Execute(w, d)
}

func (a *Authority) serveDevicePage(w http.ResponseWriter, r *http.Request) {
	a.renderDevicePage(w, http.StatusOK, devicePageData{
		UserCode:  r.URL.Query().Get("user_code"),
		AccountID: a.deviceAccountID,
	})
}

func (a *Authority) serveDeviceApprove(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	if err := r.ParseForm(); err != nil {
		a.renderDevicePage(w, http.StatusBadRequest, devicePageData{Message: "The form could not be read.", AccountID: a.deviceAccountID})
		return
	}
	code, acct := r.PostForm.Get("user_code"), strings.TrimSpace(r.PostForm.Get("account_id"))
	if acct == "" {
		acct = a.deviceAccountID
	}
	if err := a.Approve(code, acct); err != nil {
		a.renderDevicePage(w, http.StatusBadRequest, devicePageData{Message: err.Error(), UserCode: code, AccountID: acct})
		return
	}
	a.renderDevicePage(w, http.StatusOK, devicePageData{Message: "Approved for account " + acct + ". You can close this page.", AccountID: acct})
}

// bearerToken extracts the token of an "Authorization: Bearer" header.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// WriteUnauthorized writes the 401 the ChatGPT backend sends for a rejected
// bearer token, given an error from Validate: code token_expired for
// ErrExpired, invalid_token otherwise. The body never contains the token.
func WriteUnauthorized(w http.ResponseWriter, err error) {
	if errors.Is(err, ErrExpired) {
		writeError(w, http.StatusUnauthorized, "token_expired", "",
			"Provided authentication token is expired. Please try signing in again.")
		return
	}
	writeError(w, http.StatusUnauthorized, "invalid_token", "",
		"Could not validate your authentication token. Please try signing in again.")
}

// accountsCheck is the answer of GET /backend-api/wham/accounts/check.
type accountsCheck struct {
	Accounts        []checkedAccount `json:"accounts"`
	AccountOrdering []string         `json:"account_ordering"`
	DefaultAccount  string           `json:"default_account_id"`
}

type checkedAccount struct {
	ID                     string  `json:"id"`
	PlanType               string  `json:"plan_type"`
	Structure              string  `json:"structure"`
	WorkspaceBackendOrigin string  `json:"workspace_backend_origin"`
	AccountRoutingOverride string  `json:"account_routing_override"`
	Name                   *string `json:"name"`
	ProfilePictureURL      *string `json:"profile_picture_url"`
}

func (a *Authority) serveAccountsCheck(w http.ResponseWriter, r *http.Request) {
	tok, ok := bearerToken(r)
	if !ok {
		writeError(w, http.StatusUnauthorized, "missing_authorization", "Authorization",
			"missing Authorization header; want \"Authorization: Bearer <access token>\"")
		return
	}
	acct, err := a.Validate(tok)
	if err != nil {
		a.logger.InfoContext(r.Context(), "accounts check refused", "err", err)
		WriteUnauthorized(w, err)
		return
	}
	writeJSON(w, http.StatusOK, accountsCheck{
		Accounts: []checkedAccount{{
			ID:                     acct,
			PlanType:               PlanType,
			Structure:              "personal",
			WorkspaceBackendOrigin: "NO_CONSTRAINT",
			AccountRoutingOverride: "NO_CONSTRAINT",
		}},
		AccountOrdering: []string{acct},
		DefaultAccount:  acct,
	})
}
