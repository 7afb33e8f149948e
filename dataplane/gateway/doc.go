// Package gateway serves the Anthropic Messages API on the data plane's
// listener and drives each turn over an upstream Responses socket leased
// from the connection pool. Package internal/node assembles it as
// clodex-dataplane runs it:
//
//	p, err := pool.New(pool.Config{Upstream: opts, Credentials: c, Health: health, Admitter: a, Registerer: reg})
//	srv, err := gateway.New(gateway.Config{
//		Credentials: src, // *credentials.RefreshingFile, or gateway.NoRefresh(static)
//		Pool:        p,
//		Health:      health, // retry.NewHealth: the failure memory the pool shares
//		Upstream:    upstream.Key(opts.URL),
//		Budget:      budget,
//		ListenAddr:  "127.0.0.1:17645",
//		Logger:      logger,
//		Registry:    reg, // served with the pool's metrics on the admin listener
//	})
//	http.Serve(ln, srv.Handler())
//
// Routes: POST /v1/messages (any query, e.g. ?beta=true; streaming and
// non-streaming), POST /v1/messages/count_tokens (local estimate of what
// would be forwarded), GET /v1/models (the Claude ids Claude Code knows
// and the alias names and upstream models Config.Models accepts, in
// Anthropic's list shape with context windows and upstream_model, the
// Codex model each id is sent as) and GET /v1/models/{id} (any accepted
// name), HEAD on any path (200, empty: Claude Code's preconnect),
// GET /healthz ({"ok":true,"service":"clodex-dataplane"}: a prober learns
// the port is a clodex data plane). Anything else is 404 with an Anthropic
// error body "Unknown endpoint: <METHOD> <path>".
//
// Before any socket, /v1/messages and count_tokens refuse with a 400
// naming the field whatever the upstream would certainly reject (see
// translate.DecodeRequest), and a model name Config.Models does not accept
// (listing the accepted ones).
//
// Listener security. On a loopback listener any API key is accepted, but
// the Host header must name a loopback host (localhost, 127.0.0.1, [::1];
// any port) and an Origin header is refused unless allow-listed, so a web
// page cannot spend the user's quota (DNS rebinding, cross-site POSTs). On
// any other listener a key is required in x-api-key or
// "Authorization: Bearer" (compared in constant time). POST bodies must be
// Content-Type: application/json, at most Config.MaxBodyBytes (50 MiB) both
// as sent and after decoding a gzip or deflate Content-Encoding.
//
// One turn: translate the body (package translate), take a credential from
// Config.Credentials, canonicalise the input items and run attempts with
// retry.Do inside the request's budget (Config.BudgetFor for the
// credential's account, else Config.Budget: one no-data deadline shared by
// every attempt, reset only by upstream events, a total deadline and the
// retry count). Each attempt takes a lease from the connection pool
// (package pool, Config.Pool): a continuation head sends
// previous_response_id and only the new items
// (instructions and tools are resent), a new socket the full context. A
// completed response makes the socket the conversation's head
// (Lease.Complete with Stream.OutputItems and the usage); a failure or a
// cancelled turn discards it. The turn reads the socket's events from
// the Conn's own reader (upstream.Conn.Frames), in one select with its
// context and the ping ticker.
//
// Retries happen only before the client got anything it keeps (a delta,
// a tool call): a failure after message_start and empty blocks alone is
// retried, the next attempt continuing the same message
// (translate.Stream.Resume).
//
// Replacements and waits:
// previous_response_not_found, websocket_connection_limit_reached and a
// transport failure on a reused socket replace the socket at once (full
// context, unpaced); a refusal from the pool's Admitter
// (*admission.RefusedError) waits exactly its hint. A failure the client
// retries itself — a transport failure on a new socket, an unreachable
// backend, a 5xx (an upgrade 5xx, a response that failed with no output),
// a 429 (an upgrade 403 waits max(rung, hint <= 60 s) plus 0-25 % jitter)
// — is retried inside the data plane at most Config.Health's
// FailureRetries times (default once) while the upstream is healthy, and
// not at all while it is failing (retry.Health); while it is unreachable
// a turn that needs a new socket is answered at once without a dial until
// the next probe is due. A 401 on the upgrade drops the account's heads
// and asks Credentials.Rejected for one refreshed credential, then
// retries once; credentials.ErrLoginRequired (or a refresh that fails) is
// answered 401 authentication_error with x-should-retry: false. A usage
// limit (usage_limit_reached, usage_not_included, insufficient_quota) is
// never retried here: a 429 whose retry-after is the reset when it is at
// most 60 s away, else at once with x-should-retry: false and a message
// saying when the plan resets.
//
// When the turn gives up the client gets the classified status (429
// rate_limit_error, 529 for overload, 502 for other 5xx and transport
// failures, 400 "prompt is too long: N tokens > W maximum" for a context
// overflow; never an empty 200) through retry.Answer: every failure a
// retry can fix carries retry-after (its own hint, else when the upstream
// is due to be tried again) and x-should-retry: true, and its message
// says what happened and ends with "; retry after Ns". An unreachable
// upstream is named with the cause: "The upstream HOST cannot be reached:
// connection refused" (DNS, TLS, a timeout likewise). After output the SSE
// stream ends with an error event. Every turn that ends in an error, the
// SSE error after a 200 included, is logged at WARN with its cause and
// counted in clodex_dataplane_failed_turns_total; pacer refusals are
// counted in clodex_dataplane_pacer_refusals_total. A client that
// disconnects cancels the turn and its socket is closed at once. While the
// backend works without producing output, a committed stream gets a ping
// event every Config.PingInterval.
//
// Shutdown: Server.Close cancels the turns in flight (the client is told
// the data plane is shutting down; their sockets are discarded, which
// closes them at once); closing the pool afterwards (Pool.Close, by its
// owner) closes every idle socket with 1001 "pool closed", waiting at
// most upstream.CloseTimeout for the backend's answer. Every other close
// of a pooled socket is a hard close that frees the descriptor at once,
// with no close frame.
//
// Tracing: one span per turn (Gateway.Messages) and a child span per
// upstream attempt (Gateway.Attempt) with the attempt number, whether it
// is a replacement, the wait before it, reused or new socket, the pool's
// decision and generation, the admission decision and wait (set by
// package admission on the attempt's context), the upstream status and
// the account KEY (account.Key); never the raw account id, a token or
// prompt content.
package gateway
