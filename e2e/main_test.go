package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that every stack shut down completely: no server,
// socket or keep-alive goroutine outlives the tests. The Claude Code
// processes are awaited by clienttest.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
