// Package broker is the control plane's credential broker: it holds each
// account's ChatGPT sign-in for the fleet and is its only refresher, so a
// rotating refresh token has exactly one holder however many data planes
// use the account.
//
//	key, err := broker.ReadKeyFile(path)                // --credential-key-file: 32 random bytes, base64, mode 0600
//	b, err := broker.New(broker.Options{Logins: st, Key: key, TokenEndpoint: url})
//	go b.Run(ctx)                                      // refresh ahead of expiry
//	st, err := b.Import(ctx, access, refresh, id, "")   // clodexctl account import / login
//	tok, err := b.Token(ctx, key, "")                  // a data plane asks (CredentialService.GetToken)
//	tok, err = b.Token(ctx, key, tok.Access)           // after an upstream 401: one forced refresh
//	list, err := b.List(ctx)                           // clodexctl account list; Get, Remove
//
// broker.go holds the [Broker]: the logins it keeps in a [Logins] store
// ([LoginReader], [LoginWriter] and [Leaser]: the data directory's
// logins.json, or Redis shared by replicas), the lease taken before each
// refresh, the adoption of a token another replica wrote, the redemption
// (codexauth.Redeem) and the errors, [*NeedsLoginError] for a sign-in an
// operator must renew and [*UnavailableError]. key.go holds the [Key]
// that seals the tokens (AES-256-GCM, the account key authenticated with
// them, a fresh nonce per write) and the backups (BackupSealer).
// canary.go holds the key canary: CheckKey refuses a key that does not
// open the store's sign-ins (a replica started with another key), and
// RotateKey re-seals every sign-in under a new key without a refresh.
// inflight.go counts the refreshes running, which outlive callers that
// give up and which Run waits for before it returns.
// Tokens never reach logs, metrics or errors.
//
// The behaviour is specified in docs/credentials.md §8 (the key, signing
// in, refreshing once, handing tokens out, when it cannot); its metrics in
// docs/operations.md §13.
package broker
