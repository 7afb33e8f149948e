// Command poolbench measures the data plane's connection pool with real
// sockets (scripts/bench-pool.sh builds clodex-sim and this program, starts
// the emulator on a free loopback port and runs it against it).
//
// Every conversation is a Claude Code 2.1.332 request built from the
// captured fixture (system, tools, first user message; truncated strings
// padded back to their recorded length) and translated with
// dataplane/translate, exactly as the gateway does: Acquire on the pool
// with the canonical input items, send the response.create frame with
// previous_response_id and the new items on the lease's socket, run the
// events through a translate.Stream, Complete the lease with the output
// items, and append the assistant message the Collector rebuilt plus a
// 2 KB tool result to the history. Sockets are coder/websocket
// connections the pool opens (dataplane/upstream.Dial) with a static credential;
// clodex-sim runs in a separate process, so only the client side is
// measured.
//
// Runs (--runs "shape:N:turns,..."):
//
//   - one-message: the fixture's first request, one turn, per conversation;
//   - cc: a Claude-Code-shaped tool loop of the given number of turns
//     (reasoning + a Bash call per turn, a 2 KB tool result, a final text
//     reply).
//
// For each run the program creates a fresh pool, measures VmRSS
// (/proc/self/status) and heap after runtime.GC() (HeapAlloc + StackInuse),
// builds N conversations with W workers, drops every history the program
// held, measures again and reports the growth per idle pooled
// conversation. Then it prints, from the same emulator, the upstream bytes
// of a 30-turn conversation (input items and whole frames, pooled vs
// resending the full history) and the new sockets per 100 turns of a
// 20-subagent fan-out (5 rounds, each fully in flight before any
// completes), with parallel heads kept and, for comparison, closed after
// their response as the original design did.
//
// Everything runs under --timeout; the program exits non-zero when a turn
// fails or a run's pool or emulator counters disagree with what it did.
package main
