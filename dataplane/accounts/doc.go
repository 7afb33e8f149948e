// Package accounts is where a data plane's ChatGPT accounts come from and
// which one each conversation uses.
//
//	src, err := accounts.OpenFiles(ctx, []accounts.FileConfig{{Path: path}}) // one or several auth.json
//	r, err := accounts.NewRouter(accounts.Config{Source: src, Reporter: ctl})  // or Source: the broker (dataplane/control)
//	key, err := r.Route(ctx, pool, part, items) // the account of a turn
//	r.Observe(key, frame)                       // every frame a socket of the account reads (the pool's hook)
//	cred, err := r.Credential(ctx, key)         // a new socket's credential
//	cred, err = r.Rejected(ctx, key, token)     // after an upstream 401: one forced refresh
//
// Accounts are named by their key (account.Key of the ChatGPT account id);
// the raw id goes only into the chatgpt-account-id header, from the
// credential.
//
// A [Source] supplies the accounts and their credentials: [Files] serves
// Codex auth.json files, each a [RefreshingFile] that keeps its token
// fresh (docs/credentials.md): in [RefreshAuto] mode under an exclusive
// lock on "<auth.json>.lock" shared with other processes, adopting a newer
// token another program wrote there or else redeeming the refresh token
// (codexauth.Redeem) and writing the rotated tokens back atomically with
// mode 0600; in [RefreshNever] mode by re-reading the file. The control
// plane's credential broker is the other Source. A dead sign-in is an
// error wrapping [ErrLoginRequired] (a [*LoginRequiredError] carries the
// client's words); a credential that cannot be had yet but may be soon is
// an [*UnavailableError]. Errors never carry a token.
//
// The [Router] chooses: with one account every turn runs on it; with
// several, a conversation keeps the account whose idle head it continues
// (Heads.Holder) unless that account is at its usage limit, and a new
// conversation goes to the account with the most headroom in its tightest
// usage window, as the latest codex.rate_limits event read on its sockets
// says (an account never reported counts as unused; equal ones take
// turns). An account at usage_limit_reached takes no new conversation
// until its reset; a conversation on it moves to another account at its
// next turn, resending the whole conversation once. When every account is
// at its limit Route answers an [*AllLimitedError] naming the first reset.
// Each account's plan usage goes on to the control plane (Reporter), at
// most once a second unless it changed.
package accounts
