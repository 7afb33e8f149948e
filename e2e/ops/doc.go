// Package ops is the operator walkthrough test: it takes the shell blocks
// of docs/operations.md §1.1 (a team's set-up: token files, Redis, two
// control-plane replicas with the credential broker, an imported sign-in,
// scoped agent tokens, three data planes, set-rate, top, health and a turn
// through each data plane) and runs them as written, in order, in one
// bash, in a scratch directory, with the binaries built from this tree
// first on PATH and each port the blocks name replaced by a free one. A
// command the binaries refuse fails the test naming its block, so the
// docs stay true. It has no non-test code.
package ops
