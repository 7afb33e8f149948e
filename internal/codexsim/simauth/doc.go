// Package simauth emulates the OpenAI identity provider and the ChatGPT
// account check for clodex-sim, so clodex and Codex CLI can sign in,
// refresh and be rejected exactly as against the real services, without
// credentials.
//
//	a, err := simauth.New(simauth.Config{TokenTTL: time.Minute})
//	toks, err := a.Issue("acct-sim")        // a new refresh-token family: access, id and refresh tokens
//	account, err := a.Validate(bearer)      // an upgrade's token: ErrExpired, ErrInvalid
//	simauth.WriteUnauthorized(w, err)       // the backend's 401 for it
//	err = a.WriteAuthFile(path, "acct-sim") // a Codex auth.json, atomically, mode 0600
//	err = a.Approve(userCode, "acct-sim")   // with Config.ManualApproval: a device-code login
//	a.RevokeAll()                           // every family revoked
//	http.Handle("/", a.Handler())           // /oauth/token, /api/accounts/deviceauth/*, /codex/device, …
//
// An [Authority] holds everything in memory: an HS256 signing key made at
// start-up, the refresh-token families (refresh.go: rotation and reuse
// detection), the pending device-code logins (device.go), and two counters
// ([Stats]); jwt.go signs and checks the tokens, handler.go serves the
// endpoints, authfile.go writes auth.json. [Tokens] redacts itself when
// printed or logged, and refresh tokens are kept only as SHA-256 hashes.
//
// The behaviour is specified in docs/emulator.md §8 (the tokens and their
// claims, refresh rotation and its error codes, the device-code flow, the
// accounts check and auth.json).
package simauth
