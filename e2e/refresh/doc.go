// Package refresh is the multi-process end-to-end test of token refresh
// under a shared auth.json: two clodex-dataplane processes (each with its
// embedded control plane, --refresh=auto) share one Codex auth.json whose
// access tokens clodex-sim issues with a short lifetime, and serve turns
// on new and continued conversations for a while. Every turn must
// succeed and the emulator must never see a refresh token reused. The
// binaries are built with go build into a test directory. The run lasts
// CLODEX_E2E_REFRESH_DURATION (default 2m) with token lifetime
// CLODEX_E2E_REFRESH_TTL (default 20s). It has no non-test code.
package refresh
