// Package upstream is the data plane's transport to the Codex backend: one
// Responses WebSocket per [Conn], read by one goroutine the Conn owns.
//
//	conn, err := upstream.Dial(ctx, upstream.DialOptions{
//		Credential: cred, // from a credential source
//		Version:    version,
//		OnFrame:    func(frame []byte) { /* every text frame, on the reader */ },
//	})
//	err = conn.Send(ctx, frame)   // one response.create text frame
//	event, err := conn.Next(ctx)  // one server event; or select on conn.Frames()
//	conn.Watch(lost)              // idle: what the socket says next goes to lost
//	live := conn.Claim()          // a request takes it again
//	conn.Close(websocket.StatusGoingAway, "pool closed") // bounded close handshake
//	conn.CloseNow()               // hard close
//
// [Dial] opens wss://chatgpt.com/backend-api/codex/responses unless
// [DialOptions.URL] says otherwise, with the upgrade headers of
// docs/errors.md §2.1: authorization, chatgpt-account-id, originator,
// user-agent, OpenAI-Beta: responses_websockets=2026-02-06, and the W3C
// traceparent of ctx. Compression is off, the read limit is 32 MiB
// ([DefaultReadLimit]) and the handshake runs under a deadline
// ([DefaultDialTimeout]). A refused upgrade is an [*UpgradeError] carrying
// the HTTP status and Retry-After header (and, for a 401, the refused
// token), never the response body; a dial that opened no socket is an
// [*UnreachableError] naming the upstream ([Key]) and the cause.
//
// coder/websocket answers pings and sees close frames only inside a read,
// so every Conn is read at all times by its reader goroutine, which hands
// each text frame to the consumer: [Conn.Frames] (a channel, to select on
// together with a ticker and a context) or [Conn.Next]. Hooks in
// [DialOptions] run synchronously on that goroutine. Between requests
// package pool watches idle sockets with [Conn.Watch] and takes them back
// with [Conn.Claim]; whether a frame goes to the watch or to the request
// is decided once, under the Conn's lock. [Conn.Ping] is answered through
// the same reader. [Conn.Close] writes the close frame and waits for the
// peer's answer, which the reader reads, at most [CloseTimeout];
// [Conn.CloseNow] releases the descriptor at once.
//
// Package upstreamtest is a peer for tests: loopback or in-memory sockets
// the test drives frame by frame.
package upstream
