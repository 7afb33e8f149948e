// Package pool keeps upstream Responses WebSockets open as continuation
// heads, so a conversation's next turn sends only its new items with
// previous_response_id and is served from the backend's prompt cache
// (docs/pool.md describes the behaviour). It opens its own sockets
// (upstream.Dial with Config.Upstream and the partition's credential from
// [Credentials]), after asking the failure memory (Config.Health) and the
// optional [Admitter]; the sockets themselves are package upstream's.
//
//	p, err := pool.New(pool.Config{Upstream: opts, Credentials: c, Health: health, Admitter: a,
//		OnFrame: sink, OnForbidden: report403, Logger: logger})
//	lease, err := p.Acquire(ctx, part, items) // items: canonical item bytes of the full input
//	// send lease.PreviousResponseID (if set) + items[lease.Delta:] on lease.Conn (an *upstream.Conn),
//	// with the current instructions and tools, and read the response; then one of
//	lease.Complete(responseID, outputItems, usage) // the socket becomes (or stays) a head
//	lease.Discard("client cancelled")              // close it, drop the head
//	lease, err = lease.Replace(ctx, pool.ReplacePreviousResponseNotFound) // full context, new socket
//
// # Partitions and heads
//
// A [Partition] is (account, model, effort, prompt_cache_key); credentials
// are not part of it, so an access-token refresh keeps the heads. When the
// backend rejects a socket's credentials the caller drops the account's
// heads with [Pool.DropAccount]. A request with no model or no
// prompt_cache_key runs on an unpartitioned socket that is closed after
// its response.
//
// A head is one socket plus, for the response it last completed, the
// response id and a 16-byte digest (truncated SHA-256) of every canonical
// item of requestInput ++ expectedAssistant, and the positions of the
// assistant's reasoning items. Items themselves are never kept. A request
// continues the idle head whose conversation is a strict prefix of its
// own; a head also matches with its reasoning items left out (Claude Code
// drops them from its history). The longest match wins, exact before
// omitted-reasoning. A partition holds any number of heads (branches,
// rewinds, side requests, subagents).
//
// # Decisions
//
// [Pool.Acquire] sweeps expired idle heads, then decides, under one mutex
// that is never held across Admit, a dial or a close:
//
//   - continuation: an idle head matches; a nursery head is promoted to
//     established (after the established cap's evictions).
//   - rotation: the matching head's socket is RotateAge (50m) old: a new
//     socket (admitted) carries the full context and replaces it; if
//     admission is refused or the dial fails the turn uses the old socket
//     while it is younger than MaxSocketAge (58m).
//   - parallel_head: no idle match and a request of the partition is in
//     flight: a new socket with full context that becomes a nursery head
//     for its own conversation when it completes (the original closed it);
//     [Stats.SavedSockets] counts those later reused.
//   - history_mismatch_new_head / new_partition_head: a new nursery head.
//   - unpartitioned_socket: a socket that never becomes a head.
//
// Every new socket first asks the Admitter, the replacement of a socket a
// request continued included ([Lease.Replace]); only the replacement of a
// socket the request was itself admitted for does not ask again. A head
// that completes a response the waiting request extends ends its wait:
// the Admitter's context is cancelled (with the pool's cause), so it hands
// its reservation back, and the request continues the head
// ([Stats.ReturnedAdmissions]). After the Admitter returns the pool
// matches again and uses a head that freed up meanwhile instead of
// dialling ([Stats.Rematches]). New heads are registered, in flight,
// before the dial, so concurrent requests of the partition see them and
// never share a socket.
//
// # Retention
//
// Nursery heads live 5 minutes idle, established heads 30; a head whose
// age not counting time in flight reaches 55 minutes is evicted, as is an
// idle socket older than MaxSocketAge. Expiry is checked lazily at each
// Acquire, on the requesting goroutine. There is no fixed size: the
// optional caps MaxNurseryConnections and MaxConnections (0 = unbounded;
// [CapsFromEnv] reads CLODEX_WS_MAX_NURSERY_CONNECTIONS and
// CLODEX_WS_MAX_CONNECTIONS) evict the least recently used idle head of
// the generation. Busy heads are never evicted.
//
// # Idle heads are watched
//
// Every socket has a reader, its own (upstream.Conn's one goroutine):
// coder/websocket answers pings and sees close frames only inside a read,
// so without it a close from the backend, or a socket that died, would be
// found by the head's next request as a failed attempt and a replacement.
// While a head is idle the pool watches its socket (upstream.Conn.Watch):
// what the socket says goes to the pool instead of a request, the head is
// dropped at once, its
// socket closed (the descriptor released), counted under the eviction
// reasons peer_closed (a close frame), connection_lost (a read error
// without one), unexpected_frame (a data frame with no request in flight)
// or keepalive_timeout, and reported in a ws_head_lost line. Its next
// request dials once, as a new head, with nothing failed.
//
// A request that takes an idle head claims its socket
// (upstream.Conn.Claim): the watch ends, and what the reader reads next
// (the request's first frame, or the error that ended the socket) goes to
// the request. The decision between "the head is idle: drop it" and "a
// request holds it: deliver" is made once, under the socket's lock, so a
// frame is never lost or read twice; a claim that finds the watch already
// told leaves the head to be dropped and matches again.
//
// A socket can also die without a word: a NAT or firewall that forgot the
// flow, a proxy that hung, a peer host that vanished. Kernel TCP
// keepalive only checks the path to the nearest TCP peer, which for the
// backend is a TLS-terminating edge that answers it while the WebSocket
// behind it may be gone, and a NAT that dropped the flow is found only
// after minutes. So the pool uses WebSocket pings, which reach whatever
// serves the WebSocket: an idle head is pinged (upstream.Conn.Ping)
// after KeepaliveInterval (1m) idle and every interval after; no pong
// within KeepaliveTimeout (15s) drops it. A request then meets a dead
// socket only if it died in the last ~75 s, instead of waiting out the
// no-data deadline on it. The cost stays low for thousands of idle heads:
// a timer per head and no goroutine between pings; at 10,000 idle heads
// about 170 pings a second of a few dozen bytes each way, at about 50 µs
// of CPU each (measured with 2,000 real idle heads pinged every second on
// a busy 2-core machine), under 1 % of a core. Pings stop while
// a request holds the head (one already sent is then ignored, whatever
// its outcome). The reader costs one goroutine stack per
// socket, within the pool's 64 KiB per held conversation (make
// bench-pool measures it).
//
// The keepalive belongs to the head, the reader to its socket: whoever
// closes the socket (an eviction, Close, a lease ending) waits for both.
// Every close is a hard one (upstream.Conn.CloseNow) except Pool.Close's:
// a 1001 [ReasonPoolClosed] close frame whose answer the reader reads,
// within upstream.CloseTimeout.
//
// # File-descriptor exhaustion
//
// When a dial fails with EMFILE or ENFILE, or with another error while a
// probe open of os.DevNull fails with one of them, the pool hard-closes
// every idle head, least recently used first, and retries the dial once.
// The first occurrence is announced through Config.Notify with the limit
// hit and how to raise it; later ones go to the debug log and a
// ws_descriptor_exhaustion diagnostic. With nothing idle to shed the dial
// fails with a [*DescriptorExhaustionError].
//
// # Diagnostics and metrics
//
// With Config.Diagnostics set, every Acquire and Replace writes one
// ws_head_decision JSON line: decision, outcome, generation, partition
// hash, counts, caps (null when unbounded), selected/promoted/created
// connection ids, evictions with reasons and, on a miss, each idle head's
// first mismatching index with both items' hashes; a watched idle head
// that is dropped writes one ws_head_lost line (reason, the peer's close
// code or the unexpected frame's type, connection id, partition hash,
// idle time). No conversation text, token or account id is written. Metrics (Config.Registerer) are named
// clodex_dataplane_pool_*: decisions (reuse ratio), misses by reason,
// evictions by reason, heads by generation, input and cached tokens,
// rematches, saved sockets, rotations, replacements and shed connections.
package pool
