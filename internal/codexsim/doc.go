// Package codexsim is clodex-sim, an emulator of the ChatGPT Codex
// Responses WebSocket backend, for tests and benchmarks of clodex. It is
// served by cmd/clodex-sim and can be embedded in tests:
//
//	srv, err := codexsim.New(codexsim.Config{AcceptTokens: map[string]string{"sk-test": "acct-test"}})
//	ts := httptest.NewServer(srv.Handler())
//	defer srv.Close()                    // 1001 to every socket; later upgrades answer 503
//	st := srv.Stats()                    // what GET /sim/stats answers
//	err = srv.SetConfig(patch)           // what POST /sim/config does (a ConfigPatch)
//	n, err := srv.CloseIdle(codexsim.CloseIdleRequest{Account: "acct-test"}) // POST /sim/close-idle
//	srv.DropSockets()                    // every socket dropped, no close frame: a crashed backend
//	logs := srv.Sockets()                // with Config.RecordFrames: every frame, both directions
//
// The parts, by file: server.go, the [Server], its endpoints and the
// upgrade checks; throttle.go, the per-account upgrade throttle;
// session.go, one accepted socket (a reader, one response at a time,
// connection-local previous_response_id); frame.go and jsonobj.go, the
// response.create frame and its content-part checks; model.go, the #sim
// directives of the scripted model; structured.go, the JSON answer to a
// json_schema text.format; response.go, the event sequence;
// tokens.go, usage; quota.go, the plan usage windows of codex.rate_limits
// and usage limits; config.go, [Config], [Faults] and [ConfigPatch];
// stats.go, [Stats]; record.go, [SocketLog]. Package simauth is the OAuth
// emulator (Config.Auth).
//
// The protocol is specified in docs/emulator.md: endpoints (§1), upgrade
// checks (§2), the throttle (§3), frames (§4), events and usage (§5), the
// scripted model (§6), stats and run-time configuration (§7), the OAuth
// endpoints (§8), faults, recording and closing idle sockets (§9) and
// shutdown (§10). How to run it is in the repository's README.
package codexsim
