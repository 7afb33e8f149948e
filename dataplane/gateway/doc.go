// Package gateway serves the Anthropic Messages API on the data plane's
// listener and drives each turn over an upstream Responses socket.
//
//	srv, err := gateway.New(gateway.Config{
//		Credentials: src,                                  // credentials.Source
//		Dialer:      gateway.UpstreamDialer(upstream.DialOptions{URL: u}),
//		ListenAddr:  "127.0.0.1:17645",
//		Logger:      logger,
//	})
//	http.Serve(ln, srv.Handler())
//	http.Serve(adminLn, srv.AdminHandler()) // /metrics, /debug/pprof
//
// Routes: POST /v1/messages (any query, e.g. ?beta=true; streaming and
// non-streaming), POST /v1/messages/count_tokens (local estimate),
// GET /v1/models and GET /v1/models/{id} (Anthropic list shape with
// context windows), HEAD on any path (200, empty: Claude Code's
// preconnect), GET /healthz. Anything else is 404 with an Anthropic error
// body "Unknown endpoint: <METHOD> <path>".
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
// One turn, today: translate the body (package translate), take a
// credential from Config.Credentials, ask Config.Dialer for a socket, send
// one response.create frame, feed every upstream event to a
// translate.Stream until the response completes or fails, then release the
// socket. The Dialer is the seam for the connection pool of a later part;
// the Credentials source is the seam for refresh. Failures before any
// output get their classified HTTP status (and retry-after); after output
// the SSE stream ends with an error event. A client that disconnects
// cancels the turn and the socket is closed with 1001 and a reason. Idle
// (no upstream data) and total deadlines bound every turn; while the
// backend works without producing output, a committed stream gets a ping
// event every Config.PingInterval.
package gateway
