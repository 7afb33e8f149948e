// Package simauth emulates the OpenAI identity provider and the ChatGPT
// account check for clodex-sim, so clodex and Codex CLI can sign in, refresh
// and be rejected exactly as against the real services, without credentials.
//
// An [Authority] is created with [New] and holds everything in memory: an
// HS256 signing key generated at start-up, the refresh-token families, the
// pending device-code logins and two counters ([Stats]).
//
// # Tokens
//
// [Authority.Issue] starts a refresh-token family for a ChatGPT account id and
// returns a [Tokens] set. Access and id tokens are JWTs carrying iss, aud,
// sub, iat, exp, jti, email and the namespaced claim
//
//	"https://api.openai.com/auth": {"chatgpt_account_id": ..., "chatgpt_plan_type": "pro", "chatgpt_user_id": ...}
//
// As in real tokens there is no top-level chatgpt_account_id. Access tokens
// have aud ["https://api.openai.com/v1"], id tokens aud [ClientID].
// [Authority.Validate] accepts only access tokens this Authority signed (and
// the extra tokens of Config.Accept) and reports [ErrExpired] or
// [ErrInvalid]; [WriteUnauthorized] turns those into the backend's 401.
// Access-token lifetime is Config.TokenTTL (default 1h, changeable with
// [Authority.SetTokenTTL]); refresh tokens live Config.RefreshTTL (default
// 30 days, [Authority.SetRefreshTTL]).
//
// # Refresh rotation and reuse detection
//
// POST /oauth/token with grant_type=refresh_token (form-encoded or JSON, with
// refresh_token and client_id) returns a new access, id and refresh token;
// the presented refresh token is now used. Failures are 401 with the OpenAI
// error envelope, whose error.code is what Codex CLI classifies:
//
//	{"error":{"message":"...","type":"invalid_request_error","param":null,"code":"refresh_token_reused"}}
//
// The codes are:
//
//   - refresh_token_reused: the token was already rotated. The whole family is
//     revoked (its newest token stops working too) and
//     Stats.RefreshReuseDetected counts it.
//   - refresh_token_invalidated: unknown token, or its family was revoked
//     (by reuse or [Authority.RevokeAll]).
//   - refresh_token_expired: older than its RefreshTTL.
//
// Missing or malformed parameters answer 400 invalid_request naming the
// parameter; an unknown grant_type 400 unsupported_grant_type.
//
// # Device-code login
//
// The flow follows auth.openai.com: POST /api/accounts/deviceauth/usercode
// {"client_id"} returns {device_auth_id, user_code, interval:"1", expires_in};
// POST /api/accounts/deviceauth/token {device_auth_id, user_code} answers 403
// while pending and then {authorization_code, code_challenge, code_verifier},
// which POST /oauth/token with grant_type=authorization_code (code,
// code_verifier, redirect_uri ending in /deviceauth/callback, client_id)
// exchanges for a new token family. Authorization codes are single-use.
//
// Approval: by default the first poll of a login approves it for
// Config.DeviceAccountID ("acct-sim") and still answers 403, so the second
// poll succeeds; no browser is needed. With Config.ManualApproval the login
// stays pending until [Authority.Approve] is called or the form at
// GET /codex/device is submitted.
//
// # Accounts check and auth.json
//
// GET /backend-api/wham/accounts/check (bearer required) answers the account
// list Codex CLI needs in ChatGPT mode, for the token's account.
// [Authority.WriteAuthFile] writes a Codex CLI auth.json (auth_mode
// "chatgpt") holding a freshly issued family, atomically and with mode 0600.
//
// Tokens never reach logs or error messages: refresh tokens are stored only
// as SHA-256 hashes, logs name a random family id, and [Tokens] redacts
// itself when printed or logged.
package simauth
