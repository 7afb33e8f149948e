// Package broker is the control plane's credential broker: it holds each
// account's ChatGPT sign-in for the fleet and is its only refresher, so a
// rotating refresh token has exactly one holder however many data planes
// use the account.
//
// A [Broker] keeps logins in a [Logins] store ([LoginReader],
// [LoginWriter] and [Leaser]: the data directory's logins.json, or Redis
// shared by replicas) with the tokens sealed by a [Key]: AES-256-GCM, the
// account key authenticated with them, a fresh nonce per write. The key
// is read by [ReadKeyFile] from --credential-key-file: 32 random bytes in
// base64 (`head -c 32 /dev/urandom | base64`), mode 0600.
//
//	b, err := broker.New(broker.Options{Logins: st, Key: key, TokenEndpoint: url})
//	st, err := b.Import(ctx, access, refresh, id, "")   // clodexctl account import / login
//	tok, err := b.Token(ctx, key, "")                  // a data plane asks
//	tok, err = b.Token(ctx, key, tok.Access)           // after an upstream 401
//	go b.Run(ctx)                                      // refresh ahead of expiry
//
// Single writer: a refresh takes the account's lease first (a lock file,
// or a Redis key set NX with a fencing token that every write checks),
// re-reads the login and adopts a token another replica wrote meanwhile,
// and only otherwise redeems the refresh token (codexauth.Redeem, the
// data plane's client and skew rule) and writes the rotated tokens back.
// A refusal for good (refresh_token_reused, _expired, _invalidated, any
// 401) is never retried: the login is marked needs-login, every caller
// gets a [NeedsLoginError] naming `clodexctl account login`, and
// `clodexctl account list` shows it.
//
// Tokens never reach logs, metrics or errors: errors name the account key
// and the identity provider's refusal code only.
//
// Metrics (Options.Registerer):
//
//	clodex_controlplane_broker_refreshes_total{result="ok|transient|login_required"}
//	clodex_controlplane_broker_adopted_total
package broker
