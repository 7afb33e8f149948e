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
//	err = conn.Ping(ctx)          // answered through the reader
//	conn.Close(websocket.StatusGoingAway, "pool closed") // bounded close handshake
//	conn.CloseNow()               // hard close
//
// Everything is in upstream.go: [Dial] with its [DialOptions] (the upgrade
// headers, compression off, [DefaultReadLimit], [DefaultDialTimeout]), the
// errors of a dial that opened no socket — [*UpgradeError] for a refused
// upgrade (its status, Retry-After and, for a 401, the refused token;
// never the body) and [*UnreachableError] naming the upstream ([Key]) and
// the cause — and the [Conn]. coder/websocket answers pings and sees close
// frames only inside a read, so every Conn is read at all times by its
// reader, which hands each text frame to the request ([Conn.Frames],
// [Conn.Next]) or, while package pool watches the idle socket
// ([Conn.Watch]), to the watch; whether a frame goes to the watch or to a
// request that [Conn.Claim]s it is decided once, under the Conn's lock.
// Hooks in DialOptions run synchronously on the reader. [Conn.Close]
// waits at most [CloseTimeout] for the peer's answer to its close frame.
//
// The behaviour is specified in docs/errors.md §2 (the upgrade and a
// refused one) and §3 (the causes of a dial that opened no socket) and in
// docs/pool.md §9.4 (the reader, the watch and the pings). Package
// upstreamtest is a peer for tests: loopback or in-memory sockets the test
// drives frame by frame.
package upstream
