// Package upstream is the data plane's transport to the Codex backend: one
// Responses WebSocket per [Conn].
//
//	conn, err := upstream.Dial(ctx, upstream.DialOptions{
//		Credential: cred, // from package credentials
//		Version:    version,
//	})
//	err = conn.Send(ctx, frame)   // one response.create text frame
//	event, err := conn.Next(ctx)  // one server event (one text frame)
//	conn.Close(websocket.StatusNormalClosure, "turn complete")
//
// [Dial] opens wss://chatgpt.com/backend-api/codex/responses unless
// [DialOptions.URL] says otherwise, with the upgrade headers of
// docs/errors.md §2.1: authorization, chatgpt-account-id, originator,
// user-agent, OpenAI-Beta: responses_websockets=2026-02-06, and the W3C
// traceparent of ctx. Compression is off, the read limit is 32 MiB
// ([DefaultReadLimit]) and the handshake runs under a deadline
// ([DefaultDialTimeout]). A refused upgrade is an [*UpgradeError] carrying
// the HTTP status and Retry-After header, never the response body.
//
// A Conn has one reader at a time: the caller that drives a turn calls Next
// until the response ends. Cancelling the context given to Next closes the
// socket (coder/websocket semantics), which is how a client disconnect
// cancels the upstream response. Control frames are handled inside reads,
// so a socket must always have a reader: between turns package pool keeps
// one in Next, which is also what reads the pong of [Conn.Ping] (a
// keepalive check that the peer still answers).
//
// The connection pool (dataplane/pool) keeps Conns open as continuation
// heads; the gateway's pool dialer (gateway.PoolDialer) opens them.
package upstream
