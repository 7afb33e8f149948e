// Package gateway is the data plane's HTTP edge: it serves the Anthropic
// Messages API and drives each turn over a socket of the connection pool.
// Package internal/node assembles it:
//
//	srv, err := gateway.New(gateway.Config{
//		Router:   router,  // *accounts.Router: each turn's account
//		Pool:     p,       // *pool.Pool: the sockets
//		Budgets:  budgets, // *retry.Budgets: each account's turn budget
//		Health:   health,  // *retry.Health, shared with the pool
//		Upstream: upstream.Key(url),
//		ListenAddr: "127.0.0.1:17645",
//	})
//	http.Serve(srv.Listener(ln), srv.Handler()) // Close cancels the turns in flight
//
// Routes (an http.ServeMux): POST /v1/messages, POST
// /v1/messages/count_tokens (the local estimate), GET /v1/models and GET
// /v1/models/{id} (models.go), GET /healthz (which says it is a clodex
// data plane), HEAD on any path (Claude Code's preconnect). Anything else is
// 404 "Unknown endpoint: METHOD PATH", an Anthropic error body like every
// refusal. Before routing, the listener's rules: on loopback the Host must
// be a loopback host and any key is accepted; elsewhere the configured key
// is required in x-api-key or Authorization: Bearer; an Origin is refused
// unless allow-listed. Bodies must be application/json, at most
// MaxBodyBytes as sent and decoded (gzip, deflate), arriving at a minimum
// rate; a header block over MaxHeaderBytes is answered 431 (Listener).
//
// One turn (turn.go): translate the body (dataplane/translate), canonicalise
// its items, ask the Router for the account, then run attempts with
// retry.Do inside the account's budget. Each attempt takes a lease from
// the pool (a continuation sends previous_response_id and only the new
// items), sends the response.create frame and streams the events back as
// SSE (or collects the JSON answer). A completed response makes the socket
// the conversation's head. A failure is classified by retry.Classify, the
// failure table: a replacement, a wait, or the client's answer with its
// status, retry-after and x-should-retry. A 401 on the upgrade asks the
// Router for one refreshed credential. Nothing is retried after the client
// got something it keeps.
//
// Spans: Gateway.Messages per turn and Gateway.Attempt per attempt, with
// the account's key, never its id, a token or prompt content. The
// behaviour is specified in docs/translation.md, docs/errors.md and
// docs/pool.md.
package gateway
