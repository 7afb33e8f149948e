// Package console is the control plane's web console: the fleet at a
// glance in a browser, served at /console/ on the admin listener.
//
//	links, err := console.NewLinks(consoleURL, now)  // CreateConsoleLink issues, /console/signin redeems
//	c, err := console.New(console.Config{Admin: srv.Admin(), Links: links, Logger: log})
//	go c.Run(ctx)                                    // reads the fleet every SampleEvery
//	admin := telemetry.AdminOptions{..., Console: c.Handler()}
//
// It reads and acts through the admin API (AdminService, the same calls
// clodexctl makes), in process. Pages are html/template with one small
// script (a 3-second refresh of the live region, confirmations) and SVG
// charts drawn on the server, all embedded; nothing is loaded from the
// network.
//
// Sign-in: `clodexctl console` asks for a one-time link (links.go; 60 s,
// one use; the admin token never travels in a URL); following it starts
// a session (sessions.go: an HttpOnly, SameSite=Strict cookie, Secure
// under TLS; idle 1 h, at most 12 h). Without a session a page shows how
// to sign in and nothing of the fleet. State-changing requests
// (actions.go: set-rate, adaptive on/off, remove an agent credential or a member)
// need the session's CSRF token and the console's own Origin, and are
// logged with the operator who did them. Every answer carries a strict
// Content-Security-Policy (console.go).
//
// The parts, by file: console.go ([Console], [Config], routes, headers);
// pages.go (the fleet and an account's page, each quota window's
// forecast from the burn rate ListQuotas answers); sampler.go (what is
// read every few seconds, the per-minute rates and the 24-hour history,
// bounded to 500 accounts); people.go (the members, and the usage ledger:
// the last 24 hours by member, agent and account, each account's tokens
// per hour); svg.go (the charts); assets/ (templates, script,
// stylesheet).
//
// docs/operations.md §14 describes it for operators.
package console
