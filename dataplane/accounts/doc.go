// Package accounts is where a data plane's ChatGPT accounts come from and
// which one each conversation uses.
//
//	src, err := accounts.OpenFiles(ctx, []accounts.FileConfig{{Path: path}}) // one or several auth.json
//	keys, _ := src.Accounts(ctx) // auth.json files: the keys are fixed
//	r, err := accounts.NewRouter(accounts.Config{Source: src, Accounts: keys, Reporter: ctl})
//	r, err = accounts.NewRouter(accounts.Config{Source: ctl, Reporter: ctl}) // the broker (dataplane/control): keys asked each turn
//	key, err := r.Route(ctx, pool, part, items) // the account of a turn
//	r.Observe(key, frame)                       // every frame a socket of the account reads (the pool's hook)
//	cred, err := r.Credential(ctx, key)         // a new socket's credential
//	cred, err = r.Rejected(ctx, key, token)     // after an upstream 401: one forced refresh
//
// Accounts are named by their key (account.Key of the ChatGPT account id);
// the raw id goes only into the chatgpt-account-id header, from the
// credential. Errors never carry a token.
//
// The parts, by file:
//
//   - router.go: the [Source] of credentials and the [Router] that chooses
//     (one account, or the holder of the conversation's idle head through
//     [Heads], else the most headroom), learns each account's usage from
//     codex.rate_limits events and usage-limit errors ([ParseRateLimits],
//     [RateLimits]) and passes it to the [Reporter]; [*AllLimitedError]
//     when every account is at its limit; no account at all while its
//     [Standing] refuses (the control plane refused the data plane's
//     agent credential).
//   - authfile.go: [Files] ([OpenFiles]) serves Codex auth.json files, each
//     a [RefreshingFile] ([FileConfig], [RefreshMode]); refresh.go keeps its
//     token fresh (in [RefreshAuto] mode under the file's lock, adopting a
//     newer token another program wrote or redeeming the refresh token; in
//     [RefreshNever] mode by re-reading the file); write.go writes the
//     rotated tokens back, keeping every other member.
//   - member.go: the team's members as the control plane pushes them
//     ([Members], [Member], [MemberKey]), a turn's member and the account
//     its request asks for in its context ([WithMember], [WithAccount]);
//     pins.go, how they narrow the router's choice ([*NotAllowedError],
//     [*ChosenLimitedError]).
//   - fleet.go: the fleet's plan usage ([FleetView], pushed by the
//     control plane), which the choice of account uses for an account it
//     has no newer figures of.
//   - errors.go: [ErrLoginRequired] and [*LoginRequiredError] (a dead
//     sign-in, with the client's words), [*UnavailableError] (a credential
//     that may be had soon); the broker's source returns them too.
//
// The behaviour is specified in docs/credentials.md: the file, the account
// id, refresh and write-back (§1 to §7), several accounts (§9) and
// members, pins and caps (§10).
package accounts
