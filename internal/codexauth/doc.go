// Package codexauth is the ChatGPT sign-in code both planes share: the
// Codex CLI's auth.json format, the OAuth token endpoint and the
// device-code login.
//
//	f, err := codexauth.ParseAuthFile(path, data) // a Codex auth.json
//	cred := f.Credential()                        // access token, account id, expiry
//	tr, err := codexauth.Redeem(ctx, client, codexauth.DefaultTokenEndpoint, codexauth.DefaultClientID, refreshToken)
//	reason, dead := codexauth.LoginRequired(err)  // the refresh token is dead: sign in again
//	fresh := codexauth.Fresh(cred.Expiry, codexauth.TokenLifetime(cred.AccessToken), codexauth.DefaultSkew, now)
//
// A [Credential] pairs an access token, held as a [Secret] that redacts
// itself in logs, formatted output and JSON, with the ChatGPT account id
// sent as the chatgpt-account-id header. [ParseClaims] reads a JWT's
// claims without verifying its signature. Every holder of a rotating
// refresh token (the data plane's auth.json refresher, the control plane's
// credential broker) redeems it with [Redeem] and refreshes it by the one
// skew rule, [SkewFor] and [Fresh]. [StartDeviceLogin] and
// [PollDeviceLogin] are Codex CLI's device-code login (clodexctl account
// login). Errors name what was wrong and never carry a token.
package codexauth
