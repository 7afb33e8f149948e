// Package pool keeps upstream Responses WebSockets open as continuation
// heads, so a conversation's next turn sends only its new items with
// previous_response_id and is served from the backend's prompt cache
// (docs/pool.md describes the behaviour). It holds no socket
// code: sockets come from a [Dialer] and are used through the three-method
// [Conn]; new sockets are paced by an optional [Admitter].
//
//	p, err := pool.New(pool.Config{Dialer: d, Admitter: a, Logger: logger})
//	lease, err := p.Acquire(ctx, part, items) // items: canonical item bytes of the full input
//	// send lease.PreviousResponseID (if set) + items[lease.Delta:] on lease.Conn,
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
// that is never held across Admit, Dial or a Close:
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
// Every new socket except a replacement first asks the Admitter; after it
// returns (it may have waited) the pool matches again and uses a head that
// freed up during the wait instead of dialling ([Stats.Rematches]). New
// heads are registered, in flight, before the dial, so concurrent requests
// of the partition see them and never share a socket.
//
// # Retention
//
// Nursery heads live 5 minutes idle, established heads 30; a head whose
// age not counting time in flight reaches 55 minutes is evicted, as is an
// idle socket older than MaxSocketAge. Expiry is checked lazily at each
// Acquire; the pool starts no goroutines. There is no fixed size: the
// optional caps MaxNurseryConnections and MaxConnections (0 = unbounded;
// [CapsFromEnv] reads CLODEX_WS_MAX_NURSERY_CONNECTIONS and
// CLODEX_WS_MAX_CONNECTIONS) evict the least recently used idle head of
// the generation. Busy heads are never evicted.
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
// first mismatching index with both items' hashes. No conversation text,
// token or account id is written. Metrics (Config.Registerer) are named
// clodex_dataplane_pool_*: decisions (reuse ratio), misses by reason,
// evictions by reason, heads by generation, input and cached tokens,
// rematches, saved sockets, rotations, replacements and shed connections.
package pool
