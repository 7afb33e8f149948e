// Package pool keeps upstream Responses WebSockets open as continuation
// heads, so a conversation's next turn sends only its new items with
// previous_response_id and is served from the backend's prompt cache. It
// opens its own sockets (upstream.Dial with the partition's credential),
// after the failure memory and the admitter; the sockets themselves are
// package upstream's.
//
//	p, err := pool.New(pool.Config{Upstream: opts, Credentials: router, Health: health, Admitter: ctl,
//		OnFrame: router.Observe, OnForbidden: ctl.Report403, Logger: logger})
//	lease, err := p.Acquire(ctx, part, items) // items: canonical item bytes of the full input
//	// send lease.PreviousResponseID (if set) + items[lease.Delta:] on lease.Conn (an *upstream.Conn),
//	// with the current instructions and tools, and read the response; then one of
//	lease.Complete(responseID, outputItems, usage) // the socket becomes (or stays) a head
//	lease.Discard("client cancelled")              // close it, drop the head
//	lease.Release()                                // its response failed on a healthy socket: keep the socket, not the head
//	lease, err = lease.Replace(ctx, pool.ReplacePreviousResponseNotFound) // full context, new socket
//	p.DropAccount(key)                 // after an upstream 401: the account's heads go
//	key, ok := p.Holder(part, items, keys) // which account holds the head a conversation continues
//	p.Forget(part, items)              // the conversation moved to another account
//	p.Close()                          // 1001 "pool closed" to every idle head
//
// A [Partition] is (account key, model, effort, prompt_cache_key); a
// request continues the idle head of its partition whose conversation is
// a strict prefix of its own. [Pool.Acquire] decides, under one mutex that
// is never held across admission, a dial or a close; every decision is a
// Decision* constant, every eviction an Evict* reason.
//
// The parts, by file:
//
//   - config.go: [Config] and its defaults, the [Credentials] and
//     [Admitter] the pool asks, [CapsFromEnv] and [ParseCap].
//   - pool.go: [Pool], its heads and partitions, continuation,
//     [Pool.DropAccount], [Pool.Holder], [Pool.Forget] and [Pool.Close].
//   - acquire.go: [Pool.Acquire], one request's way to a socket: sweep,
//     match (canonical-item digests, the exact-prefix match), admission (a
//     head that frees up ends the wait), the second look, a new head and
//     its dial (failure memory, credential, upstream.Dial with the frame
//     and 403 hooks); lease.go: [Lease] and its Complete, Discard and
//     Replace; kept.go: [Lease.Release], the socket kept after a failed
//     response and reused for a full resend ([DecisionKeptSocket]).
//   - rotate.go: the rotation of an old socket and the unpartitioned
//     socket; exhaust.go: descriptor exhaustion
//     ([*DescriptorExhaustionError]); evict.go: TTLs and caps; watch.go:
//     idle heads watched (upstream.Conn.Watch and Claim) and pinged.
//   - diag.go: the ws_head_decision and ws_head_lost lines of
//     Config.Diagnostics; metrics.go: [Stats] and the
//     clodex_dataplane_pool_* metrics.
//
// The behaviour is specified in docs/pool.md: partitions (§2), matching
// (§3), the head snapshot (§4), decisions (§5), admission (§6),
// replacement and the socket kept after a failed response (§7, §7.1),
// descriptor exhaustion (§8), generations, TTLs, caps
// and the idle watch (§9), dropping heads (§10) and diagnostics and
// metrics (§11).
package pool
