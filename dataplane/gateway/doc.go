// Package gateway is the data plane's HTTP edge: it serves the Anthropic
// Messages API and drives each turn over a socket of the connection pool.
// Package internal/node assembles it:
//
//	srv, err := gateway.New(gateway.Config{
//		Router:   router,  // *accounts.Router: each turn's account, one refresh after a 401
//		Pool:     p,       // *pool.Pool: the sockets
//		Budgets:  budgets, // *retry.Budgets: each account's turn budget
//		Health:   health,  // *retry.Health, shared with the pool
//		Upstream: upstream.Key(url),
//		ListenAddr: "127.0.0.1:17645",
//	})
//	http.Serve(srv.Listener(ln), srv.Handler()) // Close cancels the turns in flight
//
// The parts, by file:
//
//   - server.go: [Server], the http.ServeMux method routes, the
//     listener's rules (a loopback Host, no Origin unless allow-listed), the body (Content-Type, Content-Encoding, the
//     size and arrival-rate limits), [Server.Listener] (the header limit's
//     431) and the request log line.
//   - member.go: who calls: a member key checked against the list the
//     control plane pushed ([MemberKeys], Config.Members; the member is
//     the turn's, memberOf), else the API key off loopback; every refused
//     key answered 401 with x-should-retry: false; the account a request
//     asks for (X-Clodex-Account), for the router.
//   - turn.go: one turn of POST /v1/messages: translate the body
//     (dataplane/translate), canonicalise its items, ask the [Router] for
//     the account, then run attempts with retry.Do inside the account's
//     budget. Each attempt takes a lease from the pool, sends the
//     response.create frame and streams the events back as SSE (or
//     collects the JSON answer); a completed response makes the socket the
//     conversation's head. A failure goes through retry.Classify, the
//     failure table: a replacement, a wait, or the client's answer. A 401
//     on the upgrade asks the Router for one refreshed credential. Spans:
//     Gateway.Messages per turn, Gateway.Attempt per attempt.
//   - models.go: count_tokens, GET /v1/models and GET /v1/models/{id};
//     config.go: [Config] and its defaults; metrics.go: the gateway's
//     clodex_dataplane_* metrics.
//   - usage.go: each turn's usage, handed to Config.Usage (a
//     [UsageReporter]) when the turn ends; member.go: memberOf, the
//     member a turn's usage is attributed to.
//
// The behaviour is specified in docs/translation.md (the endpoints, the
// request mapping and the answer), docs/errors.md (local errors §7, the
// retries §5, what the client receives §8, logs and metrics §10) and
// docs/pool.md (which socket a turn runs on); the spans' attributes in
// docs/operations.md §9.
package gateway
