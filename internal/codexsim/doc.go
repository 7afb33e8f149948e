// Package codexsim is clodex-sim, an emulator of the ChatGPT Codex Responses
// WebSocket backend, for tests and benchmarks of clodex. It is served by
// cmd/clodex-sim and can be embedded in tests:
//
//	srv, err := codexsim.New(codexsim.Config{AcceptTokens: map[string]string{"sk-test": "acct-test"}})
//	ts := httptest.NewServer(srv.Handler())
//	defer srv.Close()
//
// # Endpoints
//
//	GET  /backend-api/codex/responses   WebSocket, ChatGPT style (chatgpt-account-id required)
//	GET  /v1/responses                  WebSocket, API-key style (chatgpt-account-id optional)
//	GET  /sim/stats                     counters (Stats) as one JSON object
//	GET  /sim/config, POST /sim/config  running knobs; POST takes a ConfigPatch
//	POST /sim/close-idle                close an account's idle sockets (a CloseIdleRequest)
//	POST /oauth/token, /api/accounts/deviceauth/*, /codex/device,
//	GET  /backend-api/wham/accounts/check
//	                                    the OAuth emulator (Config.Auth, package simauth)
//
// An upgrade is checked in this order: a bearer token that Config.AcceptTokens
// lists or Config.Auth issued (missing, unknown or expired: 401); on the
// ChatGPT path a chatgpt-account-id header equal to the token's account
// (missing or different: 401; on the API-key path it must match when
// present); OpenAI-Beta: responses_websockets=2026-02-06 (missing: 400).
// None of these count toward the throttle. Then the injected 5xx fault, then
// the throttle: per account, an upgrade beyond Config.UpgradeLimit accepted
// upgrades in the trailing Config.UpgradeWindow answers 403 (rejections count
// only with Config.CountRejected); Config.InstantLimit and
// Config.MaxOpenSockets are optional extra limits, also answered with 403.
//
// # Frames
//
// The client sends response.create frames with the request fields at the top
// level, as Codex CLI 0.171.0 and clodex do. Frames up to Config.MaxFrameBytes
// (32 MiB) are accepted; a larger one gets an error frame with code
// request_too_large and the socket stays open. "generate": false is a prewarm:
// it completes with no output and its id can be continued. One response runs
// at a time per socket (a second create gets response_in_progress).
// previous_response_id is connection-local: an id not completed on this
// socket gets previous_response_not_found before any output. A socket older
// than Config.SocketLifetime answers websocket_connection_limit_reached.
// Message content parts are checked as the backend checks them: user, system
// and developer messages carry input_text, input_image (one of image_url —
// an http(s) URL or a base64 data: URL of a PNG, JPEG, GIF or WebP image,
// else unsupported_image_media_type — and file_id) and input_file (one of
// file_data — a base64 data: URL, with a filename — file_url and file_id);
// assistant messages carry output_text and refusal. An input_file counts
// toward usage like any item, by its canonical JSON. Malformed JSON, unknown
// frame types, bad field types, bad content parts, store:true and binary
// frames get error frames of the form
//
//	{"type":"error","status":400,"error":{"type":"invalid_request_error","code":C,"message":M,"param":P}}
//
// and the socket stays open.
//
// # Scripted model
//
// The model is deterministic and driven by directive lines in the newest
// user text: the input_text parts of the last user message, or, when the
// last input item is a function_call_output, its output string.
//
//	#sim reply <TEXT>                       reply with exactly TEXT, streamed as several output_text deltas
//	#sim call <NAME> <JSON-OBJECT>          a function_call; several lines make parallel calls, in order;
//	                                        call ids are call_1, call_2, ... per socket
//	#sim reasoning <PART1> [| <PART2> ...]  a reasoning item first, with these summary parts and an
//	                                        encrypted_content of base64("sim-reasoning:" + response id + ":" + output index)
//	#sim fail <CODE>                        response.failed with error.code CODE, before any output
//	#sim incomplete <REASON>                response.incomplete with incomplete_details.reason REASON,
//	                                        after the reply text if one is given
//	#sim error <CODE> [STATUS]              only an error frame {"type":"error","status":STATUS,"error":{"code":CODE,...}};
//	                                        STATUS defaults to 400, 0 leaves the status field out
//	#sim usage-limit <SECONDS> [PLAN]       only a usage-limit error frame: status 429, code and type
//	                                        usage_limit_reached, plan_type PLAN (default Faults.UsageLimitPlan),
//	                                        resets_in_seconds SECONDS and resets_at (Unix seconds)
//	#sim delay <DURATION>                   wait DURATION (Go syntax, e.g. 250ms, at most 1h) before the first event
//	#sim context-length                     response.failed with code context_length_exceeded
//	#sim stall                              send response.created, then nothing
//	#sim forget                             complete, but do not keep the response: continuing it gets
//	                                        previous_response_not_found (the backend lost the socket's state)
//
// Directives combine (reasoning, then reply text, then calls). Without reply,
// call or incomplete directives the reply is "Hello from clodex-sim. You said: "
// followed by the first 60 characters of the newest user text, or, after a
// function_call_output, "Tool result received: " followed by the first 60
// characters of the output. A malformed directive gets an error frame with
// code invalid_sim_directive naming the syntax. Prewarms ignore directives.
//
// # Events
//
// A response sends codex.rate_limits (informational, primary and secondary
// windows), response.created, response.in_progress, then per output item
// response.output_item.added, its content events (content_part.added,
// output_text.delta..., output_text.done, content_part.done for a message;
// function_call_arguments.delta..., .done for a call;
// reasoning_summary_part.added, reasoning_summary_text.delta..., .done,
// reasoning_summary_part.done per summary part for reasoning),
// response.output_item.done, and finally response.completed (or
// response.incomplete / response.failed) with the full output and usage.
// Every event carries sequence_number, counted per response.
//
// Usage: an item costs ceil(len(canonical JSON)/4) tokens (keys sorted, no
// spaces); instructions (as a JSON string) and the tools array count the same
// way. input_tokens is the whole context: the items of the continued chain
// (inputs and outputs), the new input items, instructions and tools.
// cached_tokens is what the socket already holds: the continued response's
// input_tokens + output_tokens (0 on a fresh chain). output_tokens counts the
// output items; reasoning_tokens the reasoning items among them.
//
// # Faults
//
// Config.Faults (flags, or POST /sim/config at run time) injects a first-byte
// delay, an inter-event delay, dropping a socket after N events (no close
// frame), a deterministic share of upgrades answered 5xx, stalling every
// response, failing every response with one error code (FailResponses), and
// a reached usage limit that resets at a set time (UsageLimitResetsIn: every
// response.create gets the usage-limit error frame until then).
// Server.DropSockets drops every open socket at once, as a crashed backend
// would. Short Config.Auth token lifetimes exercise 401s for expired tokens.
//
// # Recording
//
// With Config.RecordFrames, Server.Sockets returns every socket's frames in
// both directions (one sequence across sockets) and the close status the
// client sent: what the backend's peer really did, for in-process tests
// that assert on the wire rather than on their own instrumentation.
//
// # Idle sockets
//
// [Server.CloseIdle] (POST /sim/close-idle) closes every socket of an
// account that has no response in flight, as a backend that ends idle
// connections would: with a close frame (code 1000 and reason "idle
// connection closed" unless the request names others), or with Drop
// without one, so the client's read fails with no close status. Frames
// that reach such a socket meanwhile are ignored; Stats.IdleSocketsClosed
// counts them. It lets a client's idle-socket handling be tested on
// demand.
//
// # Shutdown
//
// Close sends every open socket a close frame with status 1001 (going away)
// and waits for the socket goroutines; later upgrades answer 503.
package codexsim
