// Package codexauth is the ChatGPT sign-in code both planes share: the
// Codex CLI's auth.json format, the OAuth token endpoint and the
// device-code login.
//
//	f, err := codexauth.ParseAuthFile(path, data) // a Codex auth.json
//	cred := f.Credential()                        // access token, account id, expiry
//	tr, err := codexauth.Redeem(ctx, client, codexauth.DefaultTokenEndpoint, codexauth.DefaultClientID, refreshToken)
//	reason, dead := codexauth.LoginRequired(err)  // the refresh token is dead: sign in again
//	fresh := codexauth.Fresh(cred.Expiry, codexauth.TokenLifetime(cred.AccessToken), codexauth.DefaultSkew, now)
//	dc, err := codexauth.StartDeviceLogin(ctx, client, codexauth.DefaultIssuer, codexauth.DefaultClientID, now)
//
// The parts, by file: secret.go, [Secret] (a token that redacts itself in
// logs, formatted output and JSON) and [Credential] (an access token with
// the ChatGPT account id sent as the chatgpt-account-id header);
// authfile.go, [ParseAuthFile] and [ParseClaims], which reads a JWT's
// claims without verifying its signature; token.go, [Redeem], the refusal
// codes that mean a dead sign-in ([LoginRequired]) and the one skew rule
// ([SkewFor], [Fresh]) every holder of a rotating refresh token uses (the
// data plane's auth.json refresher, the control plane's credential
// broker); device.go, Codex CLI's device-code login ([StartDeviceLogin],
// [PollDeviceLogin]; clodexctl account login). Errors name what was wrong
// and never carry a token.
//
// The behaviour is specified in docs/credentials.md: the file (§1), the
// account id (§2), the refresh request and its skew (§4), dead refresh
// tokens (§7) and signing in through the broker (§8).
package codexauth
